/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Finding the range that holds an address among ranges sorted by their
 * start (registered buffers, a descriptor's buffers, a segment's files).
 * Header only, so the search inlines where it runs per transfer.
 */
#ifndef TEU_SEARCH_H
#define TEU_SEARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The start of element i of `arr`. */
typedef uint64_t (*teu_start_fn)(const void *arr, size_t i);

/* How many of the n elements of `arr`, sorted by start, start at or below
 * `key`: the last such element is at that count minus one, and there is
 * none when it is 0. */
static inline size_t teu_count_at_or_below(const void *arr, size_t n, teu_start_fn start_of, uint64_t key)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (start_of(arr, mid) <= key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Whether [addr, addr + len) lies inside [start, start + size), with no
 * sum that could wrap. */
static inline bool teu_span_within(uint64_t addr, uint64_t len, uint64_t start, uint64_t size)
{
	return addr >= start && addr - start <= size && len <= size - (addr - start);
}

#endif
