/* The projection u = x W^T of the Fourier kinds (x: N x d rows, W: m x d frequencies)
 * three ways, for benchmarks/bf16_projection.py to time against each other: float32 FMAs,
 * bfloat16 inputs with float32 accumulation (AVX512_BF16's VDPBF16PS: two bf16 products
 * per float32 lane and instruction), and the same bf16 products on AMX tiles (TDPBF16PS:
 * a 16 x 16 float32 block += 16 x 32 bf16 times 32 x 16 bf16 per instruction). The first
 * two use the same register tile (8 rows x 32 columns of u in 16 zmm accumulators) so that
 * the instruction is the difference; the AMX one a 32 x 32 block of u in four tiles. Not
 * part of the package: compiled by the benchmark where the CPU has avx512_bf16 (AMX only
 * where it also has amx_bf16 and the kernel grants the tile state). */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define TARGET __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl")))

enum { ROWS = 8, COLS = 32 };

/* wt: (d, m) = W^T, m a multiple of 32; x: (N, d), N a multiple of 8; u: (N, m) */
TARGET int fp32_projection(float *u, const float *x, const float *wt, size_t N, size_t d, size_t m)
{
    if (N % ROWS || m % COLS)
        return 1;
    for (size_t i = 0; i < N; i += ROWS)
        for (size_t j = 0; j < m; j += COLS) {
            __m512 acc[ROWS][2];
#pragma GCC unroll 8
            for (int r = 0; r < ROWS; ++r)
                acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (size_t t = 0; t < d; ++t) {
                const __m512 w0 = _mm512_loadu_ps(wt + t * m + j);
                const __m512 w1 = _mm512_loadu_ps(wt + t * m + j + 16);
#pragma GCC unroll 8
                for (int r = 0; r < ROWS; ++r) {
                    const __m512 xr = _mm512_set1_ps(x[(i + r) * d + t]);
                    acc[r][0] = _mm512_fmadd_ps(xr, w0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(xr, w1, acc[r][1]);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < ROWS; ++r) {
                _mm512_storeu_ps(u + (i + r) * m + j, acc[r][0]);
                _mm512_storeu_ps(u + (i + r) * m + j + 16, acc[r][1]);
            }
        }
    return 0;
}

/* x2: (N, d/2) pairs of bf16 (x[i][2p], x[i][2p+1]) in one 32-bit word, the layout
 * fp32_to_bf16_rows writes; wt2: (d/2, m) pairs (W[j][2p], W[j][2p+1]) per column j, the
 * layout frequencies_to_bf16_pairs writes. d even. */
TARGET int bf16_projection(float *u, const uint32_t *x2, const uint32_t *wt2, size_t N, size_t d, size_t m)
{
    if (N % ROWS || m % COLS || d % 2)
        return 1;
    const size_t half = d / 2;
    for (size_t i = 0; i < N; i += ROWS)
        for (size_t j = 0; j < m; j += COLS) {
            __m512 acc[ROWS][2];
#pragma GCC unroll 8
            for (int r = 0; r < ROWS; ++r)
                acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (size_t p = 0; p < half; ++p) {
                const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wt2 + p * m + j);
                const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wt2 + p * m + j + 16);
#pragma GCC unroll 8
                for (int r = 0; r < ROWS; ++r) {
                    const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x2[(i + r) * half + p]);
                    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
                    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < ROWS; ++r) {
                _mm512_storeu_ps(u + (i + r) * m + j, acc[r][0]);
                _mm512_storeu_ps(u + (i + r) * m + j + 16, acc[r][1]);
            }
        }
    return 0;
}

/* x (n floats, n a multiple of 32) -> n bf16 rounded to nearest even, in order: a row of
 * x becomes its d/2 pairs (the conversion a bf16 path pays for q and k on every call) */
TARGET void fp32_to_bf16_rows(uint16_t *out, const float *x, size_t n)
{
    for (size_t t = 0; t < n; t += 32) {
        const __m512 lo = _mm512_loadu_ps(x + t), hi = _mm512_loadu_ps(x + t + 16);
        _mm512_storeu_si512(out + t, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* W (m, d) -> wt2 (d/2, m) pairs: wt2[p][j] = (W[j][2p], W[j][2p+1]) as bf16 (once per
 * call, m d values) */
TARGET void frequencies_to_bf16_pairs(uint32_t *wt2, const float *w, size_t m, size_t d)
{
    for (size_t p = 0; p < d / 2; ++p)
        for (size_t j = 0; j < m; ++j) {
            const __m128 two = _mm_set_ps(0.f, 0.f, w[j * d + 2 * p + 1], w[j * d + 2 * p]);
            const __m128bh b = _mm_cvtneps_pbh(two);
            uint32_t word;
            __builtin_memcpy(&word, &b, sizeof word);
            wt2[p * m + j] = word;
        }
}

/* AMX needs Linux (for the tile state) and GCC >= 11 or clang >= 12 to compile; elsewhere
 * amx_request says no. */
#if defined(__linux__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                           (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif

#if HAVE_AMX
/* AMX: the tile data state is off for a process until it asks the kernel (Linux >= 5.16)
 * for it; 0 when granted. */
enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
static int amx_granted; /* amx_projection runs no tile instruction before a granted request */

int amx_request(void)
{
    const int status = (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
    amx_granted = status == 0;
    return status;
}

/* ldtilecfg's 64-byte layout, palette 1 */
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* x2: (N, d) bf16, the layout fp32_to_bf16_rows writes; wt2: (d/2, m) bf16 pairs, the
 * layout frequencies_to_bf16_pairs writes (which is AMX's pair-interleaved B operand);
 * u: (N, m). N, m and d multiples of 32. Tiles 0-3 accumulate u's 32 x 32 block, 4-5 hold
 * two 16-row strips of x (32 bf16 of d each), 6-7 two 16-column strips of wt2 (16 pairs).
 * Returns 1 for sizes it does not take, 3 when amx_request has not been granted (on a CPU
 * without AMX, or where Linux refused, a tile instruction would kill the process). */
__attribute__((target("amx-tile,amx-bf16"))) int amx_projection(float *u, const uint16_t *x2, const uint32_t *wt2,
                                                                 size_t N, size_t d, size_t m)
{
    if (N % 32 || m % 32 || d % 32)
        return 1;
    if (!amx_granted)
        return 3;
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    const long x_stride = (long)(d * sizeof *x2), w_stride = (long)(m * sizeof *wt2), u_stride = (long)(m * sizeof *u);
    for (size_t i = 0; i < N; i += 32)
        for (size_t j = 0; j < m; j += 32) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (size_t t = 0; t < d; t += 32) {
                _tile_loadd(4, x2 + i * d + t, x_stride);
                _tile_loadd(5, x2 + (i + 16) * d + t, x_stride);
                _tile_loadd(6, wt2 + (t / 2) * m + j, w_stride);
                _tile_loadd(7, wt2 + (t / 2) * m + j + 16, w_stride);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, u + i * m + j, u_stride);
            _tile_stored(1, u + i * m + j + 16, u_stride);
            _tile_stored(2, u + (i + 16) * m + j, u_stride);
            _tile_stored(3, u + (i + 16) * m + j + 16, u_stride);
        }
    _tile_release();
    return 0;
}
#else
int amx_request(void) { return -1; }

int amx_projection(float *u, const uint16_t *x2, const uint32_t *wt2, size_t N, size_t d, size_t m)
{
    (void)u, (void)x2, (void)wt2, (void)N, (void)d, (void)m;
    return 2;
}
#endif
