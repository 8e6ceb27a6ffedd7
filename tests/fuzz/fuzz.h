/*
 * fuzz.h - what the libFuzzer harnesses of tests/fuzz share: the entry
 * points libFuzzer calls, and a check that turns a broken invariant into a
 * crash libFuzzer reports (with the input that broke it).
 */
#ifndef IDEMPROXY_FUZZ_H
#define IDEMPROXY_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant of the code under test; abort() is a finding. */
#define FUZZ_REQUIRE(cond)                                                  \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "%s:%d: invariant broken: %s\n",     \
				__FILE__, __LINE__, #cond);                 \
			abort();                                            \
		}                                                           \
	} while (0)

/* data[skip..size) in a buffer of exactly its length (one byte when it is
 * empty), free() it: inputs are not NUL-terminated, and so that ASan sees
 * a read past their end they are not given with libFuzzer's bytes after
 * them. NULL when out of memory. */
static inline uint8_t *fuzz_copy(const uint8_t *data, size_t size, size_t skip)
{
	uint8_t *copy = malloc(size - skip ? size - skip : 1);

	if (copy != NULL && size > skip)
		memcpy(copy, data + skip, size - skip);
	return copy;
}

#endif
