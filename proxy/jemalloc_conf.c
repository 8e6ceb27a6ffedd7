/*
 * jemalloc_conf.c - the options jemalloc starts with, in a binary linked
 * with it (meson's -Djemalloc; docs/architecture.md "Memory").
 *
 * background_thread: pages freed when records expire go back to the
 * kernel from jemalloc's own threads after its decay time (10 s), instead
 * of whenever a worker next happens to allocate. A store that emptied
 * after a burst then shrinks while the proxy is quiet.
 *
 * MALLOC_CONF in the environment is read after this and wins.
 */
extern const char *malloc_conf;
const char *malloc_conf = "background_thread:true";
