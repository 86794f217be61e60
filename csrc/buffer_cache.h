/* A small cache of large freed memory blocks, so that repeated calls with the same shapes
 * (a training loop) get back pages that are already mapped instead of fresh ones the
 * kernel must fault in and clear. Used for the kernels' workspaces and, through a NumPy
 * memory handler (module.c), for the output arrays. Plain C, thread-safe; no Python here. */
#ifndef FF_BUFFER_CACHE_H
#define FF_BUFFER_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* Blocks of at least this many bytes are cached; smaller ones go straight to malloc. */
#define FF_BUFFER_CACHE_MIN_BYTES ((size_t)1 << 20)
/* Default bound on the bytes held in the cache. */
#define FF_BUFFER_CACHE_DEFAULT_BYTES ((size_t)256 << 20)

/* Bytes in a cache line (x86-64, and most ARM cores): fresh blocks start on one (except
 * on Windows), and the kernels' prefetch plans ask for memory a line at a time. */
#define FF_CACHE_LINE 64

/* malloc / calloc with the same contract (NULL on failure), taking a cached block of
 * exactly `size` bytes when there is one (zeroed by ff_buffer_calloc). */
void *ff_buffer_malloc(size_t size);
void *ff_buffer_calloc(size_t count, size_t size);
/* realloc of a block from the functions above (never cached while in use), kept on a
 * cache line where fresh blocks are. */
void *ff_buffer_realloc(void *ptr, size_t size);
/* Give back a block allocated above with `size` bytes: cached when large and within the
 * bound (evicting the oldest blocks), freed otherwise. */
void ff_buffer_free(void *ptr, size_t size);

/* Hold and release the cache's lock: for fork handlers (taken before fork(), released in
 * parent and child), so a child never inherits the table half-updated or the lock held. */
void ff_buffer_cache_lock(void);
void ff_buffer_cache_unlock(void);

/* Set the bound in bytes (0: cache nothing), freeing cached blocks beyond it. */
void ff_buffer_cache_set_limit(size_t bytes);
typedef struct {
    size_t blocks, bytes, limit;
    uint64_t hits, misses;
} ff_buffer_cache_info;
ff_buffer_cache_info ff_buffer_cache_stats(void);

#endif /* FF_BUFFER_CACHE_H */
