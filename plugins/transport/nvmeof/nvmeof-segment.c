/* SPDX-License-Identifier: Apache-2.0 */
/*
 * File segments: the descriptor `mooncake/nvmeof/<name>` lists files, each a
 * buffer of the segment laid end to end. Each file is resolved to a path on
 * this host (its local_path_map entry for our name, else file_path) and
 * opened once, buffered and O_DIRECT, for the segment's lifetime. A file that
 * cannot be opened does not fail the segment: transfers that touch it fail,
 * with a log line naming it, and the others proceed.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-glib/json-glib.h>

#include <te/te-json.h> /* after json-glib: te_json_load() */

#include "nvmeof.h"
#include "teu-search.h"

void nv_file_log(nv_ctx *c, nv_file *f, int level, const char *fmt, ...)
{
	unsigned n = atomic_fetch_add_explicit(&f->errors, 1, memory_order_relaxed) + 1;
	char msg[768];
	va_list ap;

	if (n > NV_LOG_FIRST && n % NV_LOG_EVERY != 0)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (n > NV_LOG_FIRST)
		c->host->log(c->host, level, "%s (%u errors on this file so far)", msg, n);
	else
		c->host->log(c->host, level, "%s", msg);
}

/* ----------------------------------------------------------- descriptor */

/* A size or offset member: a JSON integer in [1, 2^63). NULL when it is one,
 * else what is wrong with it. Fractions and exponents parse as doubles and
 * integers of 2^63 and more wrap negative in json-glib: both refused here. */
static const char *json_u64(JsonObject *o, const char *member, uint64_t *out)
{
	JsonNode *n = json_object_get_member(o, member);

	if (n == NULL)
		return "missing";
	if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64)
		return "not an integer";
	gint64 v = json_node_get_int(n);
	if (v <= 0)
		return "not in [1, 2^63)";
	*out = (uint64_t)v;
	return NULL;
}

static const char *json_str(JsonNode *n)
{
	if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING)
		return NULL;
	return json_node_get_string(n);
}

static bool good_path(const char *p)
{
	return p != NULL && *p != '\0' && strlen(p) < PATH_MAX;
}

/* Fills s->files from the descriptor text; the paths only, nothing opened. */
static int parse_descriptor(nv_ctx *c, const te_segment_info *seg, nv_segment *s)
{
	static const te_json_limits lim = { NV_DESC_MAX_DEPTH, NV_DESC_MAX_ITEMS, NV_DESC_MAX_VALUES,
					    NV_DESC_MAX_STRING, NV_DESC_MAX_TEXT };
	const te_host *h = c->host;
	const char *me = h->local_name(h);
	char why[256];
	JsonNode *root = NULL, *bn;
	JsonArray *arr;
	int rc = TE_ERR_METADATA;

	/* The host decoded this text already, but it comes from the store:
	 * bounded here too, with this format's tighter limits. */
	if (seg->descriptor == NULL) {
		h->log(h, TE_LOG_ERROR, "segment %s: no descriptor", s->name);
		goto out;
	}
	root = te_json_load(seg->descriptor, strlen(seg->descriptor), &lim, why, sizeof why);
	if (root == NULL) {
		h->log(h, TE_LOG_ERROR, "segment %s: descriptor refused: %s", s->name, why);
		goto out;
	}
	if (!JSON_NODE_HOLDS_OBJECT(root)) {
		h->log(h, TE_LOG_ERROR, "segment %s: descriptor is not a JSON object", s->name);
		goto out;
	}
	const char *proto = json_str(json_object_get_member(json_node_get_object(root), "protocol"));
	if (proto == NULL || strcmp(proto, "nvmeof") != 0) {
		/* A memory segment forced onto this transport: not ours to serve. */
		h->log(h, TE_LOG_ERROR,
		       "segment %s: protocol is \"%s\", not \"nvmeof\"; only file segments "
		       "(mooncake/nvmeof/<name>) go through this transport",
		       s->name, proto ? proto : "?");
		rc = -ENOTSUP;
		goto out;
	}
	bn = json_object_get_member(json_node_get_object(root), "buffers");
	if (bn == NULL || !JSON_NODE_HOLDS_ARRAY(bn) ||
	    json_array_get_length(arr = json_node_get_array(bn)) == 0) {
		h->log(h, TE_LOG_ERROR, "segment %s: descriptor lists no files (\"buffers\" %s)", s->name,
		       bn == NULL ? "missing" : JSON_NODE_HOLDS_ARRAY(bn) ? "empty" : "not an array");
		goto out;
	}
	s->n_files = json_array_get_length(arr);
	if (s->n_files != seg->n_buffers) {
		h->log(h, TE_LOG_ERROR, "segment %s: descriptor has %zu files, the host decoded %zu",
		       s->name, s->n_files, seg->n_buffers);
		goto out;
	}
	s->files = g_new0(nv_file, s->n_files);
	for (size_t i = 0; i < s->n_files; i++)
		s->files[i].fd = s->files[i].dfd = s->files[i].fixed = s->files[i].dfixed = -1;
	for (size_t i = 0; i < s->n_files; i++) {
		nv_file *f = &s->files[i];
		JsonNode *en = json_array_get_element(arr, (guint)i);
		JsonObject *b;
		const char *path, *mapped = NULL;

		if (!JSON_NODE_HOLDS_OBJECT(en)) {
			h->log(h, TE_LOG_ERROR, "segment %s: buffer %zu is not an object", s->name, i);
			goto out;
		}
		b = json_node_get_object(en);
		const char *bad = json_u64(b, "length", &f->length);
		if (bad == NULL && f->length != seg->buffers[i].length)
			bad = "not the length the host decoded";
		if (bad != NULL) {
			h->log(h, TE_LOG_ERROR, "segment %s: buffer %zu: missing or bad \"length\" (%s)",
			       s->name, i, bad);
			goto out;
		}
		path = json_str(json_object_get_member(b, "file_path"));
		if (!good_path(path)) {
			h->log(h, TE_LOG_ERROR, "segment %s: buffer %zu: missing or bad \"file_path\"", s->name,
			       i);
			goto out;
		}
		JsonNode *mn = json_object_get_member(b, "local_path_map");
		if (mn != NULL && !JSON_NODE_HOLDS_NULL(mn)) {
			if (!JSON_NODE_HOLDS_OBJECT(mn)) {
				h->log(h, TE_LOG_ERROR, "segment %s: buffer %zu: \"local_path_map\" is not an object",
				       s->name, i);
				goto out;
			}
			JsonNode *mine = me ? json_object_get_member(json_node_get_object(mn), me) : NULL;
			if (mine != NULL) {
				mapped = json_str(mine);
				if (!good_path(mapped)) {
					h->log(h, TE_LOG_ERROR,
					       "segment %s: buffer %zu: local_path_map entry for %s is not a path",
					       s->name, i, me);
					goto out;
				}
			}
		}
		f->path = g_strdup(mapped ? mapped : path);
		if (TE_HAS_OP(h, metric_device) && TE_HAS_OP(h, metric_add))
			f->mdev = h->metric_device(h, f->path);
		f->start = s->total;
		if (s->total + f->length < s->total) {
			h->log(h, TE_LOG_ERROR, "segment %s: total length overflows", s->name);
			goto out;
		}
		s->total += f->length;
		h->log(h, TE_LOG_DEBUG, "segment %s: file %zu is %s (%s), %llu bytes at %llu", s->name, i,
		       f->path, mapped ? "local_path_map" : "file_path", (unsigned long long)f->length,
		       (unsigned long long)f->start);
	}
	rc = 0;
out:
	if (root != NULL)
		json_node_unref(root);
	return rc;
}

/* ----------------------------------------------------------------- files */

static void dio_alignment(nv_file *f)
{
	/* Conservative default: no device has a logical block above 4 KiB. */
	f->mem_align = 4096;
	f->off_align = 4096;
#ifdef STATX_DIOALIGN
	struct statx sx;
	if (statx(f->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
	    (sx.stx_mask & STATX_DIOALIGN)) {
		if (sx.stx_dio_mem_align == 0 || sx.stx_dio_offset_align == 0) {
			f->mem_align = f->off_align = 0; /* the file system says: no direct I/O */
			return;
		}
		f->mem_align = sx.stx_dio_mem_align;
		f->off_align = sx.stx_dio_offset_align;
		return;
	}
#endif
	if (f->blockdev) {
		int lbs = 0;
		if (ioctl(f->fd, BLKSSZGET, &lbs) == 0 && lbs > 0 && (lbs & (lbs - 1)) == 0)
			f->mem_align = f->off_align = (uint32_t)lbs;
	}
}

static void open_direct(nv_ctx *c, nv_segment *s, size_t i, const char *rp, const struct stat *st,
			int extra);

/* Opens one file; on failure records why in f->err and leaves fd at -1. */
static void open_file(nv_ctx *c, nv_segment *s, size_t i)
{
	const te_host *h = c->host;
	nv_file *f = &s->files[i];
	int extra = c->dsync ? O_DSYNC : 0;
	char why[2 * PATH_MAX + 256], *rp = NULL;
	struct stat pre, st;
	int fd;

	/* The path comes from the store: only what TE_NVMEOF_ALLOW lists, and
	 * only a regular file or block device, is ever opened. */
	fd = nv_path_check(c, f->path, &rp, &pre, why, sizeof why);
	if (fd < 0) {
		f->err = fd;
		h->log(h, TE_LOG_WARN,
		       "segment %s: file %zu (%s) %s: %s; transfers touching segment bytes [%llu, %llu) "
		       "will fail",
		       s->name, i, f->path, fd == TE_ERR_REJECTED ? "refused" : "cannot be opened", why,
		       (unsigned long long)f->start, (unsigned long long)(f->start + f->length));
		return;
	}
	/* O_NONBLOCK so a FIFO swapped in after the check cannot block the open. */
	fd = nv_open_resolved(rp, O_RDWR | O_NONBLOCK | extra, &pre);
	f->writable = fd >= 0;
	if (fd == -EACCES || fd == -EROFS || fd == -EPERM)
		fd = nv_open_resolved(rp, O_RDONLY | O_NONBLOCK | extra, &pre);
	if (fd < 0) {
		f->err = fd;
		h->log(h, TE_LOG_WARN,
		       "segment %s: file %zu (%s) cannot be opened: %s; transfers touching segment "
		       "bytes [%llu, %llu) will fail",
		       s->name, i, f->path, nv_strerror(fd), (unsigned long long)f->start,
		       (unsigned long long)(f->start + f->length));
		free(rp);
		return;
	}
	const char *call = "fstat"; /* for the log line when a call below fails */
	int fl;
	if (fstat(fd, &st) != 0)
		goto failed;
	/* io_uring honours O_NONBLOCK on regular files by failing with EAGAIN
	 * instead of waiting for the disk: clear it. */
	call = "fcntl";
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
		goto failed;
	f->fd = fd;
	f->blockdev = S_ISBLK(st.st_mode);
	f->size = (uint64_t)st.st_size;
	if (f->blockdev) {
		uint64_t bytes = 0;
		f->size = ioctl(fd, BLKGETSIZE64, &bytes) == 0 ? bytes : 0;
	}
	if (f->size < f->length)
		h->log(h, TE_LOG_WARN,
		       "segment %s: file %zu (%s) holds %llu bytes but its descriptor declares %llu: "
		       "reads past byte %llu of it will fail%s",
		       s->name, i, f->path, (unsigned long long)f->size, (unsigned long long)f->length,
		       (unsigned long long)f->size, f->blockdev ? ", and writes too" : "");
	if (!f->writable)
		h->log(h, TE_LOG_WARN, "segment %s: file %zu (%s) is read-only here; writes to it will fail",
		       s->name, i, f->path);

	f->fixed = nv_fixed_add(c, fd);
	if (c->use_direct)
		open_direct(c, s, i, rp, &st, extra);
	free(rp);
	h->log(h, TE_LOG_INFO, "segment %s: file %zu (%s) open, %s I/O, %s", s->name, i, f->path,
	       f->dfd >= 0 ? "direct and buffered" : "buffered",
	       f->fixed >= 0 && (f->dfd < 0 || f->dfixed >= 0) ? "registered with the rings"
	       : c->n_fixed > 0 ? "not registered with the rings (their file tables are full)"
				: "not registered with the rings");
	return;
failed:
	f->err = -errno;
	h->log(h, TE_LOG_WARN, "segment %s: file %zu (%s): %s failed: %s", s->name, i, f->path, call,
	       g_strerror(errno));
	close(fd);
	free(rp);
}

/* Opens the O_DIRECT descriptor of an open file, when its file system has
 * direct I/O. */
static void open_direct(nv_ctx *c, nv_segment *s, size_t i, const char *rp, const struct stat *st,
			int extra)
{
	const te_host *h = c->host;
	nv_file *f = &s->files[i];

	dio_alignment(f);
	if (f->mem_align == 0) {
		h->log(h, TE_LOG_INFO, "segment %s: %s: the file system has no direct I/O; buffered I/O",
		       s->name, f->path);
		return;
	}
	/* The checked path again, and only if it is still the same file. */
	int dfd = nv_open_resolved(rp, (f->writable ? O_RDWR : O_RDONLY) | O_DIRECT | extra, st);
	if (dfd == -ESTALE) {
		h->log(h, TE_LOG_WARN, "segment %s: %s changed while being opened; buffered I/O only",
		       s->name, f->path);
		return;
	}
	if (dfd < 0) {
		h->log(h, TE_LOG_INFO, "segment %s: %s: no O_DIRECT (%s); buffered I/O", s->name, f->path,
		       g_strerror(-dfd));
		return;
	}
	f->dfd = dfd;
	f->dfixed = nv_fixed_add(c, dfd);
	atomic_store(&f->direct, 1);
}

void nv_segment_close(nv_ctx *c, nv_segment *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; s->files != NULL && i < s->n_files; i++) {
		nv_fixed_remove(c, s->files[i].fixed);
		nv_fixed_remove(c, s->files[i].dfixed);
		if (s->files[i].fd >= 0)
			close(s->files[i].fd);
		if (s->files[i].dfd >= 0)
			close(s->files[i].dfd);
		g_free(s->files[i].path);
	}
	g_free(s->files);
	g_free(s->name);
	g_free(s);
}

int nv_segment_open(nv_ctx *c, const te_segment_info *seg, nv_segment **out)
{
	nv_segment *s = g_new0(nv_segment, 1);
	size_t usable = 0;
	int rc;

	s->name = g_strdup(seg->name ? seg->name : "?");
	rc = parse_descriptor(c, seg, s);
	if (rc < 0) {
		nv_segment_close(c, s);
		return rc;
	}
	for (size_t i = 0; i < s->n_files; i++) {
		open_file(c, s, i);
		usable += s->files[i].fd >= 0;
	}
	c->host->log(c->host, TE_LOG_INFO, "segment %s: %zu of %zu files open, %llu bytes", s->name,
		     usable, s->n_files, (unsigned long long)s->total);
	*out = s;
	return 0;
}

static uint64_t file_start(const void *arr, size_t i)
{
	return ((const nv_file *)arr)[i].start;
}

size_t nv_segment_find(const nv_segment *s, uint64_t pos)
{
	/* the last file starting at or below pos (the first starts at 0) */
	size_t n = teu_count_at_or_below(s->files, s->n_files, file_start, pos);
	return n > 0 ? n - 1 : 0;
}

uint32_t nv_count_slices(const nv_segment *s, size_t fi, uint64_t pos, uint64_t len, uint64_t slice)
{
	uint64_t n = 0, end = pos + len;

	while (pos < end && fi < s->n_files) {
		const nv_file *f = &s->files[fi];
		uint64_t fend = f->start + f->length;
		uint64_t piece = (fend < end ? fend : end) - pos;
		n += (piece + slice - 1) / slice;
		pos += piece;
		fi++;
	}
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}
