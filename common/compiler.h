/*
 * compiler.h - attributes every module uses. MUSTCHECK marks a function
 * whose result says whether it worked (0 / -1, a pointer or NULL): the
 * caller must look (pgbouncer's _MUSTCHECK).
 */
#ifndef IDEMPROXY_COMPILER_H
#define IDEMPROXY_COMPILER_H

#define MUSTCHECK __attribute__((warn_unused_result))

#endif
