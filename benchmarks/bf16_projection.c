/* The projection u = x W^T of the Fourier kinds (x: N x d rows, W: m x d frequencies) two
 * ways, for benchmarks/bf16_projection.py to time against each other: float32 FMAs, and
 * bfloat16 inputs with float32 accumulation (AVX512_BF16's VDPBF16PS: two bf16 products
 * per float32 lane and instruction). Both use the same register tile (8 rows x 32
 * columns of u in 16 zmm accumulators) so that the instruction is the difference. Not part
 * of the package: compiled by the benchmark where the CPU has avx512_bf16. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

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
