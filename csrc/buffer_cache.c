/* The block cache of buffer_cache.h: at most FF_CACHE_SLOTS blocks, matched by exact size
 * (a loop asks for the same sizes again), oldest evicted first. A spin lock guards the
 * table because kernels allocate with the GIL released while other Python threads may be
 * creating or freeing arrays; compilers without GCC's atomic builtins get no cache. */
#if !defined(_WIN32) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* posix_memalign and madvise under -std=c99 */
#endif
#include "buffer_cache.h"

#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define FF_CACHE_SLOTS 32

#if defined(__GNUC__)
#define FF_CACHE_ENABLED 1
static int cache_lock_flag = 0;
static void cache_lock(void)
{
    while (__atomic_exchange_n(&cache_lock_flag, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&cache_lock_flag, __ATOMIC_RELAXED))
            ;
}
static void cache_unlock(void) { __atomic_store_n(&cache_lock_flag, 0, __ATOMIC_RELEASE); }
#else
#define FF_CACHE_ENABLED 0
static void cache_lock(void) {}
static void cache_unlock(void) {}
#endif

void ff_buffer_cache_lock(void) { cache_lock(); }
void ff_buffer_cache_unlock(void) { cache_unlock(); }

typedef struct {
    void *ptr;
    size_t size;
} cache_slot;

/* slots[0 .. count) from oldest to newest */
static cache_slot slots[FF_CACHE_SLOTS];
static size_t count = 0, held = 0;
static size_t limit = FF_CACHE_ENABLED ? FF_BUFFER_CACHE_DEFAULT_BYTES : 0;
static uint64_t hits = 0, misses = 0;

static void remove_slot(size_t i)
{
    held -= slots[i].size;
    memmove(slots + i, slots + i + 1, (count - i - 1) * sizeof *slots);
    --count;
}

/* A cached block of exactly `size` bytes (the newest), or NULL. */
static void *take(size_t size)
{
    void *p = NULL;
    if (size < FF_BUFFER_CACHE_MIN_BYTES)
        return NULL;
    cache_lock();
    for (size_t i = count; i-- > 0;)
        if (slots[i].size == size) {
            p = slots[i].ptr;
            remove_slot(i);
            break;
        }
    if (p)
        ++hits;
    else
        ++misses;
    cache_unlock();
    return p;
}

/* Fresh blocks start on a cache line (FF_ALIGNED_BLOCKS): a vector load or store at the
 * start of a row then never straddles two lines (an array from plain malloc starts 16
 * bytes into one). Windows has no posix_memalign, and its aligned blocks need their own
 * free: there fresh blocks are malloc's. */
#if defined(_WIN32)
#define FF_ALIGNED_BLOCKS 0
#else
#define FF_ALIGNED_BLOCKS 1
#endif

/* Fresh blocks of 4 MiB or more start on a 2 MiB boundary and ask Linux for transparent huge
 * pages (where it is set to "madvise", a common default): fewer TLB misses as the products
 * and the row passes sweep them. NumPy's own allocator asks the same for arrays of that size,
 * which the kernels' outputs, made through the block cache's handler, would otherwise lose.
 * Zen 3, N = 4096: a forward + backward 1-3% faster (docs/performance.md). */
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define FF_HUGE_PAGES 1
#define FF_HUGE_PAGE ((size_t)2 << 20)
#define FF_HUGE_MIN_BYTES ((size_t)4 << 20)
#else
#define FF_HUGE_PAGES 0
#endif

static void *fresh_block(size_t size)
{
#if FF_ALIGNED_BLOCKS
    void *p = NULL;
#if FF_HUGE_PAGES
    if (size >= FF_HUGE_MIN_BYTES) {
        if (posix_memalign(&p, FF_HUGE_PAGE, size) != 0)
            return NULL;
        madvise(p, size, MADV_HUGEPAGE); /* a hint: failing, the block is still good */
        return p;
    }
#endif
    return posix_memalign(&p, FF_CACHE_LINE, size ? size : 1) == 0 ? p : NULL;
#else
    return malloc(size ? size : 1);
#endif
}

void *ff_buffer_malloc(size_t size)
{
    void *p = take(size);
    return p ? p : fresh_block(size);
}

void *ff_buffer_calloc(size_t n, size_t size)
{
    if (size && n > (size_t)-1 / size)
        return NULL;
    void *p = ff_buffer_malloc(n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

/* realloc keeps no alignment beyond malloc's: a block it moved off a cache line is moved
 * once more, to a fresh block (the size's bytes copied: past the old size they are as
 * undefined as realloc leaves them). Failing that, the unaligned block is still correct. */
void *ff_buffer_realloc(void *ptr, size_t size)
{
    void *p = realloc(ptr, size ? size : 1);
    if (!FF_ALIGNED_BLOCKS || !p || (uintptr_t)p % FF_CACHE_LINE == 0)
        return p; /* without aligned blocks, fresh blocks are malloc's too */
    void *aligned = fresh_block(size);
    if (!aligned)
        return p;
    memcpy(aligned, p, size);
    free(p);
    return aligned;
}

void ff_buffer_free(void *ptr, size_t size)
{
    void *evicted[FF_CACHE_SLOTS + 1];
    size_t nev = 0;
    if (!ptr)
        return;
    cache_lock();
    if (size < FF_BUFFER_CACHE_MIN_BYTES || size > limit) {
        evicted[nev++] = ptr;
    } else {
        while (count && (count == FF_CACHE_SLOTS || held + size > limit)) {
            evicted[nev++] = slots[0].ptr;
            remove_slot(0);
        }
        slots[count].ptr = ptr;
        slots[count].size = size;
        ++count;
        held += size;
    }
    cache_unlock();
    for (size_t i = 0; i < nev; ++i) /* outside the lock: free may take a while */
        free(evicted[i]);
}

void ff_buffer_cache_set_limit(size_t bytes)
{
    void *evicted[FF_CACHE_SLOTS];
    size_t nev = 0;
    cache_lock();
    limit = FF_CACHE_ENABLED ? bytes : 0;
    while (count && held > limit) {
        evicted[nev++] = slots[0].ptr;
        remove_slot(0);
    }
    cache_unlock();
    for (size_t i = 0; i < nev; ++i)
        free(evicted[i]);
}

ff_buffer_cache_info ff_buffer_cache_stats(void)
{
    ff_buffer_cache_info info;
    cache_lock();
    info.blocks = count;
    info.bytes = held;
    info.limit = limit;
    info.hits = hits;
    info.misses = misses;
    cache_unlock();
    return info;
}
