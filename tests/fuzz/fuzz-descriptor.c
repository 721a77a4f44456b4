/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Segment descriptors and rpc_meta records (docs/wire.md, "Metadata keys" and
 * "Segment descriptors") as a peer or a shared store hands them over:
 * te_desc_decode(), which must answer as json-glib's reading of the same text
 * does (te_desc_decode_dom()), then, on success, te_desc_contains() must
 * never accept a range that lies outside every buffer (it guards every
 * remote READ/WRITE).
 * segment.c is compiled in for its static rpc_meta parser.
 */
#include "../../libte/segment.c"

#include "fuzz.h"

/* Which descriptors list files: by name here, so that the fuzzer loads no
 * plugin (the host asks the transports' flags). */
static bool files_by_name(const char *protocol)
{
	return strcmp(protocol, "nvmeof") == 0;
}

/* The slow, obvious answer to te_desc_contains(). */
static bool inside_one(const te_desc *d, uint64_t addr, uint64_t len)
{
	if (addr + len < addr)
		return false;
	if (d->file_segment)
		return addr <= d->file_size && len <= d->file_size - addr;
	for (size_t i = 0; i < d->n_buffers; i++) {
		const te_desc_buffer *b = &d->buffers[i];
		if (addr >= b->addr && addr + len <= b->addr + b->length)
			return true;
	}
	return false;
}

static void check_range(const te_desc *d, uint64_t addr, uint64_t len)
{
	if (te_desc_contains(d, addr, len))
		FUZZ_CHECK(inside_one(d, addr, len));
}

/* The two readers: the same answer, the same fields. */
static void same_as_dom(int rc, const te_desc *d, const char *text, size_t size)
{
	te_desc *t = NULL;
	int rc2 = te_desc_decode_dom(text, size, files_by_name, &t);

	FUZZ_CHECK(rc == rc2);
	if (rc == 0 && rc2 == 0) {
		FUZZ_CHECK(strcmp(d->name, t->name) == 0 && strcmp(d->protocol, t->protocol) == 0);
		FUZZ_CHECK((d->auth == NULL) == (t->auth == NULL) && (d->auth == NULL || strcmp(d->auth, t->auth) == 0));
		FUZZ_CHECK(d->file_segment == t->file_segment && d->file_size == t->file_size);
		FUZZ_CHECK(d->n_buffers == t->n_buffers);
		for (size_t i = 0; i < d->n_buffers && i < t->n_buffers; i++)
			FUZZ_CHECK(d->buffers[i].addr == t->buffers[i].addr &&
				   d->buffers[i].length == t->buffers[i].length &&
				   strcmp(d->buffers[i].name, t->buffers[i].name) == 0);
	}
	te_desc_free(t);
}

static void descriptor(const char *text, size_t size)
{
	te_desc *d = NULL;
	int rc = te_desc_decode_with(text, size, files_by_name, &d);

	same_as_dom(rc, d, text, size);
	if (rc < 0) {
		FUZZ_CHECK(d == NULL && rc == TE_ERR_METADATA);
		return;
	}
	FUZZ_CHECK(d != NULL && d->name != NULL && *d->name != '\0' && d->protocol != NULL);
	for (size_t i = 0; i < d->n_buffers; i++) {
		const te_desc_buffer *b = &d->buffers[i];
		FUZZ_CHECK(b->length > 0 && b->name != NULL);
		if (!d->file_segment && i > 0)
			FUZZ_CHECK(d->buffers[i - 1].addr <= b->addr);
		check_range(d, b->addr, b->length);
		check_range(d, b->addr, b->length + 1);
		check_range(d, b->addr - 1, 2);
		check_range(d, b->addr + b->length - 1, 1);
		check_range(d, b->addr + b->length, 1);
		check_range(d, b->addr, UINT64_MAX);
	}
	check_range(d, 0, 1);
	check_range(d, UINT64_MAX, 1);
	te_desc_free(d);
}

static void rpc_meta(const char *text, size_t size)
{
	char *host = NULL;
	int port = 0;

	if (parse_rpc_meta(text, size, &host, &port) == 0) {
		FUZZ_CHECK(host != NULL && *host != '\0' && strlen(host) < TE_MAX_NAME);
		FUZZ_CHECK(port > 0 && port <= 65535);
		g_free(host);
	} else {
		FUZZ_CHECK(host == NULL);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool once;
	if (!once) {
		te_set_log_handler(fuzz_quiet, NULL);
		te_set_log_level(TE_LOG_TRACE);
		once = true;
	}
	/* A copy with a terminator: JSON parsers must stop at `size`, and a
	 * NUL inside is just another byte to them. */
	char *text = fuzz_str(data, size);
	descriptor(text, size);
	rpc_meta(text, size);
	free(text);
	return 0;
}
