/*
 * jemalloc_conf.c - the options jemalloc starts with, in a binary linked
 * with it (meson's -Djemalloc; docs/architecture.md "Memory: the
 * allocator").
 *
 * background_thread: pages freed when records expire go back to the kernel
 * after jemalloc's decay time (10 s) from a thread of its own, so the
 * madvise calls that return them are not made inside a worker's loop or
 * the sweeper's.
 *
 * MALLOC_CONF in the environment is read after this and wins.
 */
extern const char *malloc_conf;
const char *malloc_conf = "background_thread:true";
