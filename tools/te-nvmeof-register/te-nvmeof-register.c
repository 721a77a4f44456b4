/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-nvmeof-register: creates and edits NVMe-oF segment descriptors
 * (mooncake/nvmeof/<name>) in any metadata store libte has a plugin for.
 *
 *   register  on the storage server: the segment's files and their lengths
 *   mount     on a reading host: where that host mounted one of the files
 *   unmount   removes a host's mount path
 *   show      prints the descriptor
 *   remove    deletes the descriptor
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>
#include <json-glib/json-glib.h>

#include <te/te-json.h> /* after json-glib: te_json_load() */
#include <te/te.h>

#include "teu-json.h"

#define PREFIX "nvmeof/"

static const char *usage_text =
	"usage: te-nvmeof-register [-m CONN] COMMAND ...\n"
	"\n"
	"  register SEGMENT FILE[:LENGTH]... [--server-name NAME] [--allocate]\n"
	"      create or replace the descriptor of SEGMENT: its files, in order, laid end\n"
	"      to end. LENGTH (bytes; K, M, G, T suffixes) defaults to the file's size.\n"
	"      Mount paths already recorded for a file that stays are kept.\n"
	"  mount SEGMENT FILE_PATH LOCAL_PATH [--host NAME]\n"
	"      record that host NAME (default: this host's name) reaches FILE_PATH at\n"
	"      LOCAL_PATH; NAME must be the local name its engines are created with\n"
	"  unmount SEGMENT FILE_PATH [--host NAME]\n"
	"  show SEGMENT\n"
	"  remove SEGMENT\n"
	"\n"
	"  -m, --metadata CONN   metadata connection string (etcd://h:p, redis://h:p,\n"
	"                        http://h:p/metadata, ...); default $TE_METADATA_SERVER,\n"
	"                        then $MC_METADATA_SERVER\n"
	"  SEGMENT is \"disk0\" or \"nvmeof/disk0\"; the key is mooncake/nvmeof/disk0.\n"
	"\n"
	"  Reading hosts open only what their TE_NVMEOF_ALLOW lists (engine option or\n"
	"  environment): colon-separated directories (the regular files at or below\n"
	"  them), files and block devices (exactly those). Unset, they open nothing.\n"
	"  List where LOCAL_PATH (or FILE_PATH, for hosts without a mount path) lies,\n"
	"  e.g. TE_NVMEOF_ALLOW=/mnt/te:/dev/nvme1n1 on each reading host.\n";

static int usage(void)
{
	fputs(usage_text, stderr);
	return 2;
}

/* ----------------------------------------------------------- descriptor */

typedef struct file_entry {
	char *path;
	uint64_t length;
	GTree *map; /* host → local path, sorted */
} file_entry;

typedef struct descriptor {
	char *server_name;
	GPtrArray *files; /* file_entry* */
} descriptor;

static gint cmp_str(gconstpointer a, gconstpointer b, gpointer u)
{
	(void)u;
	return strcmp(a, b);
}

static file_entry *entry_new(const char *path, uint64_t length)
{
	file_entry *e = g_new0(file_entry, 1);
	e->path = g_strdup(path);
	e->length = length;
	e->map = g_tree_new_full(cmp_str, NULL, g_free, g_free);
	return e;
}

static void entry_free(gpointer p)
{
	file_entry *e = p;
	g_free(e->path);
	g_tree_unref(e->map);
	g_free(e);
}

static descriptor *desc_new(void)
{
	descriptor *d = g_new0(descriptor, 1);
	d->files = g_ptr_array_new_with_free_func(entry_free);
	return d;
}

static void desc_free(descriptor *d)
{
	if (d == NULL)
		return;
	g_free(d->server_name);
	g_ptr_array_unref(d->files);
	g_free(d);
}

/* What a stored descriptor may be: the format nests 4 deep (object, buffers,
 * buffer, local_path_map), has a few files and a map entry per reading host,
 * and paths of at most PATH_MAX bytes (a few times that with escapes). The
 * store is shared, so the text is bounded before it is parsed. */
static const te_json_limits desc_limits = { 8, 16384, 262144, 4 * PATH_MAX, 8u << 20 };

/* The string member `name` of `o`: NULL with *bad set when it is there but
 * no string, or a string of 0 or PATH_MAX bytes or more. */
static const char *str_member(JsonObject *o, const char *name, bool *bad)
{
	JsonNode *n = json_object_get_member(o, name);

	*bad = false;
	if (n == NULL)
		return NULL;
	if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING) {
		*bad = true;
		return NULL;
	}
	const char *s = json_node_get_string(n);
	size_t len = strlen(s);
	*bad = len == 0 || len >= PATH_MAX;
	return *bad ? NULL : s;
}

/* Parses a stored descriptor; NULL with a message naming what is wrong when
 * it is not one this tool may rewrite. */
static descriptor *desc_parse(const char *text, size_t len, const char *key)
{
	char why[256];
	descriptor *d = NULL;
	JsonObject *root;
	JsonNode *top, *n;
	bool bad;

	top = te_json_load(text, len, &desc_limits, why, sizeof why);
	if (top == NULL) {
		fprintf(stderr, "error: %s does not hold a descriptor this tool accepts: %s\n", key, why);
		return NULL;
	}
	if (!JSON_NODE_HOLDS_OBJECT(top)) {
		fprintf(stderr, "error: %s does not hold a JSON object\n", key);
		goto out;
	}
	root = json_node_get_object(top);
	const char *proto = str_member(root, "protocol", &bad);
	if (proto == NULL || strcmp(proto, "nvmeof") != 0) {
		fprintf(stderr, "error: %s is not an NVMe-oF descriptor (protocol %s%s%s)\n", key,
			proto ? "\"" : "", proto ? proto : bad ? "not a string" : "missing", proto ? "\"" : "");
		goto out;
	}
	d = desc_new();
	const char *server = str_member(root, "server_name", &bad);
	if (bad) {
		fprintf(stderr, "error: %s: \"server_name\" is not a name\n", key);
		goto bad;
	}
	d->server_name = g_strdup(server ? server : "");
	n = json_object_get_member(root, "buffers");
	if (n == NULL || !JSON_NODE_HOLDS_ARRAY(n)) {
		fprintf(stderr, "error: %s has no \"buffers\" array\n", key);
		goto bad;
	}
	JsonArray *arr = json_node_get_array(n);
	for (guint i = 0; i < json_array_get_length(arr); i++) {
		JsonNode *en = json_array_get_element(arr, i);
		if (!JSON_NODE_HOLDS_OBJECT(en)) {
			fprintf(stderr, "error: %s: buffer %u is not an object\n", key, i);
			goto bad;
		}
		JsonObject *b = json_node_get_object(en);
		/* a length: an integer in [1, 2^63); fractions parse as doubles,
		 * and json-glib wraps integers from 2^63 up to negative ones */
		JsonNode *ln = json_object_get_member(b, "length");
		if (ln == NULL || !JSON_NODE_HOLDS_VALUE(ln) || json_node_get_value_type(ln) != G_TYPE_INT64 ||
		    json_node_get_int(ln) <= 0) {
			fprintf(stderr, "error: %s: buffer %u: \"length\" is %s, not an integer in [1, 2^63)\n",
				key, i,
				ln == NULL ? "missing"
				: JSON_NODE_HOLDS_VALUE(ln) && json_node_get_value_type(ln) == G_TYPE_INT64
					? "out of range"
					: "of another type");
			goto bad;
		}
		const char *path = str_member(b, "file_path", &bad);
		if (path == NULL) {
			fprintf(stderr, "error: %s: buffer %u: \"file_path\" is %s\n", key, i,
				bad ? "not a path" : "missing");
			goto bad;
		}
		file_entry *e = entry_new(path, (uint64_t)json_node_get_int(ln));
		g_ptr_array_add(d->files, e);
		JsonNode *mn = json_object_get_member(b, "local_path_map");
		if (mn == NULL || JSON_NODE_HOLDS_NULL(mn))
			continue;
		if (!JSON_NODE_HOLDS_OBJECT(mn)) {
			fprintf(stderr, "error: %s: buffer %u: \"local_path_map\" is not an object\n", key, i);
			goto bad;
		}
		JsonObjectIter it;
		const gchar *k;
		JsonNode *v;
		json_object_iter_init(&it, json_node_get_object(mn));
		while (json_object_iter_next(&it, &k, &v)) {
			const char *local = str_member(json_node_get_object(mn), k, &bad);
			if (local == NULL || *k == '\0') {
				fprintf(stderr, "error: %s: buffer %u: local_path_map entry \"%.64s\" is not a "
						"host name and a path\n",
					key, i, k);
				goto bad;
			}
			g_tree_replace(e->map, g_strdup(k), g_strdup(local));
		}
	}
	goto out;
bad:
	desc_free(d);
	d = NULL;
	fprintf(stderr, "(te-nvmeof-register remove deletes it; register then writes a new one)\n");
out:
	json_node_unref(top);
	return d;
}

static gboolean add_map_member(gpointer k, gpointer v, gpointer builder)
{
	json_builder_set_member_name(builder, k);
	json_builder_add_string_value(builder, v);
	return FALSE;
}

/* Compact JSON with sorted keys, like every descriptor libte writes; NULL
 * when out of memory. free() frees it. */
static char *desc_encode(const descriptor *d)
{
	JsonBuilder *b = json_builder_new();

	json_builder_begin_object(b);
	json_builder_set_member_name(b, "buffers");
	json_builder_begin_array(b);
	for (guint i = 0; i < d->files->len; i++) {
		const file_entry *e = g_ptr_array_index(d->files, i);
		json_builder_begin_object(b);
		json_builder_set_member_name(b, "file_path");
		json_builder_add_string_value(b, e->path);
		json_builder_set_member_name(b, "length");
		json_builder_add_int_value(b, (gint64)e->length);
		json_builder_set_member_name(b, "local_path_map");
		json_builder_begin_object(b);
		g_tree_foreach(e->map, add_map_member, b);
		json_builder_end_object(b);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	json_builder_set_member_name(b, "protocol");
	json_builder_add_string_value(b, "nvmeof");
	json_builder_set_member_name(b, "server_name");
	json_builder_add_string_value(b, d->server_name);
	json_builder_end_object(b);
	return teu_json_finish(b, NULL);
}

/* ------------------------------------------------------------- store I/O */

typedef struct ctx {
	te_metadata *md;
	char key[512];
	char *segment; /* "nvmeof/<name>" */
} ctx;

static int open_segment(ctx *c, const char *conn, const char *segment)
{
	int rc;

	if (segment == NULL || *segment == '\0' || strcmp(segment, PREFIX) == 0) {
		fprintf(stderr, "error: empty segment name\n");
		return -EINVAL;
	}
	for (const char *s = segment; *s; s++)
		if (g_ascii_isspace(*s) || g_ascii_iscntrl(*s)) {
			fprintf(stderr, "error: segment name '%s' contains white space or control characters\n",
				segment);
			return -EINVAL;
		}
	c->segment = g_str_has_prefix(segment, PREFIX) ? g_strdup(segment)
						       : g_strconcat(PREFIX, segment, NULL);
	rc = te_metadata_segment_key(c->segment, c->key, sizeof c->key);
	if (rc < 0 || (size_t)rc >= sizeof c->key) {
		fprintf(stderr, "error: segment name '%s' is too long\n", segment);
		return -ENAMETOOLONG;
	}
	if (conn == NULL || *conn == '\0') {
		fprintf(stderr, "error: no metadata store: pass -m CONN or set TE_METADATA_SERVER\n");
		return -EINVAL;
	}
	rc = te_metadata_open(conn, &c->md);
	if (rc < 0) {
		/* named without the password of a user-info ("user:***@host") */
		const char *start = strstr(conn, "://");
		start = start ? start + 3 : conn;
		const char *end = start + strcspn(start, "/?#");
		const char *at = g_strrstr_len(start, end - start, "@");
		const char *colon = at ? memchr(start, ':', (size_t)(at - start)) : NULL;
		char *shown = colon ? g_strdup_printf("%.*s:***%s", (int)(colon - conn), conn, at) : g_strdup(conn);
		fprintf(stderr, "error: cannot open metadata store '%s': %s\n", shown, te_strerror(rc));
		g_free(shown);
	}
	return rc;
}

/* The stored descriptor, NULL when the key is missing (*rc = -ENOENT) or bad. */
static descriptor *load(ctx *c, int *rc)
{
	char *val = NULL;
	size_t len = 0;

	*rc = te_metadata_get(c->md, c->key, &val, &len);
	if (*rc < 0) {
		if (*rc != -ENOENT)
			fprintf(stderr, "error: reading %s failed: %s\n", c->key, te_strerror(*rc));
		return NULL;
	}
	descriptor *d = desc_parse(val, len, c->key);
	te_free(val);
	if (d == NULL)
		*rc = TE_ERR_METADATA;
	return d;
}

static int store(ctx *c, const descriptor *d)
{
	char *text = desc_encode(d);
	int rc = text != NULL ? te_metadata_put(c->md, c->key, text, strlen(text)) : -ENOMEM;

	if (rc < 0)
		fprintf(stderr, "error: writing %s failed: %s\n", c->key, te_strerror(rc));
	else
		printf("%s = %s\n", c->key, text);
	free(text);
	return rc;
}

/* -------------------------------------------------------------- register */

static bool parse_size(const char *s, uint64_t *out)
{
	char *end = NULL;
	unsigned long long v;
	unsigned shift = 0;

	if (s == NULL || !g_ascii_isdigit(*s))
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0)
		return false;
	switch (*end) {
	case '\0': break;
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: return false;
	}
	if (*end != '\0' || v == 0 || (shift && v > (UINT64_MAX >> shift)) || v > (unsigned long long)(INT64_MAX >> shift))
		return false;
	*out = (uint64_t)v << shift;
	return true;
}

/* The size of a regular file or block device, -errno on failure. */
static int64_t file_size(const char *path)
{
	struct stat st;

	if (stat(path, &st) != 0)
		return -errno;
	if (S_ISREG(st.st_mode))
		return st.st_size;
	if (!S_ISBLK(st.st_mode))
		return -EINVAL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	uint64_t bytes = 0;
	if (fd < 0)
		return -errno;
	int rc = ioctl(fd, BLKGETSIZE64, &bytes);
	int e = errno;
	close(fd);
	return rc == 0 ? (int64_t)bytes : -e;
}

static int allocate(const char *path, uint64_t length)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	int rc;

	if (fd < 0)
		return -errno;
	rc = posix_fallocate(fd, 0, (off_t)length);
	if (rc == EOPNOTSUPP || rc == EINVAL) /* file systems without fallocate */
		rc = ftruncate(fd, (off_t)length) == 0 ? 0 : errno;
	close(fd);
	return -rc;
}

static int cmd_register(ctx *c, char **files, int n, const char *server_name, bool do_allocate)
{
	descriptor *old, *d = desc_new();
	int rc = 0;

	if (n == 0) {
		fprintf(stderr, "error: register needs at least one FILE[:LENGTH]\n");
		desc_free(d);
		return 2;
	}
	for (int i = 0; i < n && rc == 0; i++) {
		char *path = g_strdup(files[i]);
		char *colon = strrchr(path, ':');
		uint64_t length = 0;
		/* "path:LENGTH"; a colon not followed by a length belongs to the path */
		if (colon != NULL && parse_size(colon + 1, &length))
			*colon = '\0';
		if (path[0] != '/')
			fprintf(stderr, "warning: %s is a relative path; readers resolve it in their own "
					"working directory\n", path);
		int64_t size = rc == 0 ? file_size(path) : 0;
		if (rc == 0 && size == -ENOENT && !do_allocate) {
			fprintf(stderr, "error: %s does not exist (--allocate with a LENGTH creates it)\n", path);
			rc = -ENOENT;
		} else if (rc == 0 && size < 0 && size != -ENOENT) {
			fprintf(stderr, "error: %s: %s\n", path,
				size == -EINVAL ? "not a regular file or block device" : g_strerror((int)-size));
			rc = (int)size;
		} else if (rc == 0 && length == 0 && size <= 0) {
			fprintf(stderr, "error: %s is empty or missing: give its length as %s:LENGTH\n", path, path);
			rc = -EINVAL;
		} else if (rc == 0 && length > 0 && (size < 0 || (uint64_t)size < length)) {
			if (!do_allocate) {
				fprintf(stderr, "error: %s holds %lld bytes, less than the %llu to register "
						"(--allocate extends it)\n",
					path, (long long)(size < 0 ? 0 : size), (unsigned long long)length);
				rc = -ENOSPC;
			} else if ((rc = allocate(path, length)) < 0) {
				fprintf(stderr, "error: cannot allocate %llu bytes for %s: %s\n",
					(unsigned long long)length, path, g_strerror(-rc));
			}
		}
		if (rc == 0)
			g_ptr_array_add(d->files, entry_new(path, length ? length : (uint64_t)size));
		g_free(path);
	}
	if (rc < 0) {
		desc_free(d);
		return 1;
	}
	old = load(c, &rc);
	if (old == NULL && rc != -ENOENT) {
		desc_free(d);
		return 1;
	}
	if (old != NULL) {
		/* Keep what readers recorded for files that stay. */
		for (guint i = 0; i < d->files->len; i++) {
			file_entry *e = g_ptr_array_index(d->files, i);
			for (guint j = 0; j < old->files->len; j++) {
				file_entry *o = g_ptr_array_index(old->files, j);
				if (strcmp(o->path, e->path) == 0) {
					g_tree_unref(e->map);
					e->map = g_tree_ref(o->map);
					break;
				}
			}
		}
	}
	d->server_name = g_strdup(server_name ? server_name
				  : old && *old->server_name ? old->server_name
							      : g_get_host_name());
	desc_free(old);
	rc = store(c, d);
	desc_free(d);
	return rc < 0 ? 1 : 0;
}

/* ----------------------------------------------------------------- mount */

static int cmd_mount(ctx *c, const char *file_path, const char *local_path, const char *host)
{
	int rc;
	descriptor *d = load(c, &rc);
	file_entry *hit = NULL;

	if (d == NULL) {
		if (rc == -ENOENT)
			fprintf(stderr, "error: no descriptor under %s: register the segment first\n", c->key);
		return 1;
	}
	for (guint i = 0; i < d->files->len; i++) {
		file_entry *e = g_ptr_array_index(d->files, i);
		if (strcmp(e->path, file_path) == 0)
			hit = e;
	}
	if (hit == NULL) {
		fprintf(stderr, "error: segment %s has no file %s; its files:", c->segment, file_path);
		for (guint i = 0; i < d->files->len; i++)
			fprintf(stderr, " %s", ((file_entry *)g_ptr_array_index(d->files, i))->path);
		fputc('\n', stderr);
		desc_free(d);
		return 1;
	}
	if (local_path != NULL) {
		int64_t size = file_size(local_path);
		if (size < 0)
			fprintf(stderr, "warning: %s is not readable here (%s); recorded anyway\n", local_path,
				g_strerror((int)-size));
		else if ((uint64_t)size < hit->length)
			fprintf(stderr, "warning: %s holds %lld bytes, the segment declares %llu\n", local_path,
				(long long)size, (unsigned long long)hit->length);
		g_tree_replace(hit->map, g_strdup(host), g_strdup(local_path));
	} else if (!g_tree_remove(hit->map, host)) {
		fprintf(stderr, "note: %s had no mount path for host %s\n", file_path, host);
	}
	rc = store(c, d);
	desc_free(d);
	return rc < 0 ? 1 : 0;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
	const char *conn = getenv("TE_METADATA_SERVER");
	const char *server_name = NULL, *host = NULL;
	bool do_allocate = false;
	char **pos = g_new0(char *, (size_t)argc + 1);
	int npos = 0, rc = 0;
	ctx c = { 0 };

	if (conn == NULL)
		conn = getenv("MC_METADATA_SERVER");
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char **target = NULL;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			fputs(usage_text, stdout);
			g_free(pos);
			return 0;
		} else if (strcmp(a, "-m") == 0 || strcmp(a, "--metadata") == 0) {
			target = &conn;
		} else if (strcmp(a, "--server-name") == 0) {
			target = &server_name;
		} else if (strcmp(a, "--host") == 0) {
			target = &host;
		} else if (strcmp(a, "--allocate") == 0) {
			do_allocate = true;
			continue;
		} else if (g_str_has_prefix(a, "--metadata=")) {
			conn = a + strlen("--metadata=");
			continue;
		} else if (g_str_has_prefix(a, "--server-name=")) {
			server_name = a + strlen("--server-name=");
			continue;
		} else if (g_str_has_prefix(a, "--host=")) {
			host = a + strlen("--host=");
			continue;
		} else if (a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "error: unknown option %s\n", a);
			g_free(pos);
			return usage();
		} else {
			pos[npos++] = argv[i];
			continue;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "error: %s needs a value\n", a);
			g_free(pos);
			return usage();
		}
		*target = argv[++i];
	}
	if (npos < 2) {
		g_free(pos);
		return usage();
	}
	if (host == NULL)
		host = g_get_host_name();
	if ((server_name && *server_name == '\0') || *host == '\0') {
		fprintf(stderr, "error: --server-name and --host take a non-empty name\n");
		g_free(pos);
		return 2;
	}

	const char *cmd = pos[0];
	bool known = strcmp(cmd, "register") == 0 || strcmp(cmd, "mount") == 0 ||
		     strcmp(cmd, "unmount") == 0 || strcmp(cmd, "show") == 0 || strcmp(cmd, "remove") == 0;
	if (!known) {
		fprintf(stderr, "error: unknown command '%s'\n", cmd);
		g_free(pos);
		return usage();
	}
	if (open_segment(&c, conn, pos[1]) < 0) {
		rc = 1;
		goto out;
	}
	if (strcmp(cmd, "register") == 0) {
		rc = cmd_register(&c, pos + 2, npos - 2, server_name, do_allocate);
	} else if (strcmp(cmd, "mount") == 0) {
		if (npos != 4) {
			fprintf(stderr, "error: mount takes SEGMENT FILE_PATH LOCAL_PATH\n");
			rc = 2;
		} else {
			rc = cmd_mount(&c, pos[2], pos[3], host);
		}
	} else if (strcmp(cmd, "unmount") == 0) {
		if (npos != 3) {
			fprintf(stderr, "error: unmount takes SEGMENT FILE_PATH\n");
			rc = 2;
		} else {
			rc = cmd_mount(&c, pos[2], NULL, host);
		}
	} else if (npos != 2) {
		fprintf(stderr, "error: %s takes SEGMENT only\n", cmd);
		rc = 2;
	} else if (strcmp(cmd, "show") == 0) {
		char *val = NULL;
		int r = te_metadata_get(c.md, c.key, &val, NULL);
		if (r == -ENOENT)
			fprintf(stderr, "error: no descriptor under %s\n", c.key);
		else if (r < 0)
			fprintf(stderr, "error: reading %s failed: %s\n", c.key, te_strerror(r));
		else
			printf("%s\n", val);
		te_free(val);
		rc = r < 0;
	} else {
		int r = te_metadata_remove(c.md, c.key);
		if (r < 0)
			fprintf(stderr, "error: removing %s failed: %s\n", c.key, te_strerror(r));
		else
			printf("removed %s\n", c.key);
		rc = r < 0;
	}
out:
	te_metadata_close(c.md);
	g_free(c.segment);
	g_free(pos);
	return rc;
}
