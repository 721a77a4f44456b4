/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A metadata store kept in a directory, one file per key: "file://<dir>".
 * A fixture for tests and benchmarks that need a store (NVMe-oF segments
 * cannot live in P2PHANDSHAKE) without starting a server. Keys are escaped
 * into file names (%XX for anything outside [A-Za-z0-9._-]); a put writes a
 * temporary file and renames it over the key, so readers never see half a
 * value.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <te/te-plugin.h>

#define MAX_VALUE (64u << 20)

typedef struct fs_ctx {
	const te_host *host;
	char *dir;
	unsigned seq;
} fs_ctx;

static int is_plain(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '.' || ch == '_' || ch == '-';
}

/* "<dir>/<escaped key>", malloc()ed; NULL on a bad key. */
static char *key_path(fs_ctx *c, const char *key)
{
	size_t n = strlen(key), dl = strlen(c->dir);
	char *p, *o;

	if (n == 0 || n > 1024)
		return NULL;
	p = malloc(dl + 1 + 3 * n + 1);
	if (p == NULL)
		return NULL;
	memcpy(p, c->dir, dl);
	o = p + dl;
	*o++ = '/';
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)key[i];
		if (is_plain(ch) && !(i == 0 && ch == '.')) {
			*o++ = (char)ch;
		} else {
			sprintf(o, "%%%02X", ch);
			o += 3;
		}
	}
	*o = '\0';
	return p;
}

static int unescape(const char *name, char *out, size_t cap)
{
	size_t o = 0;

	for (size_t i = 0; name[i] != '\0'; i++) {
		unsigned v;
		if (o + 1 >= cap)
			return -1;
		if (name[i] == '%') {
			if (sscanf(name + i + 1, "%2X", &v) != 1)
				return -1;
			out[o++] = (char)v;
			i += 2;
		} else {
			out[o++] = name[i];
		}
	}
	out[o] = '\0';
	return 0;
}

static int fs_open(const te_host *h, const char *conn, void **out)
{
	const char *dir = conn + strlen("file://");
	struct stat st;

	if (strncmp(conn, "file://", 7) != 0 || *dir == '\0') {
		h->log(h, TE_LOG_ERROR, "connection string '%s' is not file://<directory>", conn);
		return -EINVAL;
	}
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		h->log(h, TE_LOG_ERROR, "file store: %s is not a directory", dir);
		return -ENOENT;
	}
	fs_ctx *c = calloc(1, sizeof *c);
	if (c == NULL || (c->dir = strdup(dir)) == NULL) {
		free(c);
		return -ENOMEM;
	}
	c->host = h;
	*out = c;
	return 0;
}

static void fs_close(void *ctx)
{
	fs_ctx *c = ctx;
	free(c->dir);
	free(c);
}

/* All `len` bytes read from fd into `in`, or written to it from `out` (the
 * other NULL), again after EINTR: 0, or a negative errno (-EIO when the file
 * ends first). */
static int io_all(int fd, char *in, const char *out, size_t len)
{
	for (size_t done = 0; done < len;) {
		ssize_t n = in != NULL ? read(fd, in + done, len - done) : write(fd, out + done, len - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		done += (size_t)n;
	}
	return 0;
}

static int fs_get(void *ctx, const char *key, char **value, size_t *len)
{
	fs_ctx *c = ctx;
	char *path = key_path(c, key);
	struct stat st;
	int fd, rc = 0;

	if (path == NULL)
		return -EINVAL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : -errno;
	if (fstat(fd, &st) != 0 || st.st_size > MAX_VALUE) {
		close(fd);
		return -EFBIG;
	}
	size_t got = (size_t)st.st_size;
	char *buf = malloc(got + 1);
	if (buf == NULL) {
		close(fd);
		return -ENOMEM;
	}
	rc = io_all(fd, buf, NULL, got);
	close(fd);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	buf[got] = '\0';
	*value = buf;
	*len = got;
	return 0;
}

static int fs_put(void *ctx, const char *key, const char *value, size_t len, unsigned flags)
{
	fs_ctx *c = ctx;
	char *path = key_path(c, key);
	char tmp[4200];
	int fd, rc = 0;

	(void)flags;
	if (path == NULL)
		return -EINVAL;
	snprintf(tmp, sizeof tmp, "%s/.tmp-%d-%u", c->dir, (int)getpid(),
		 __atomic_fetch_add(&c->seq, 1, __ATOMIC_RELAXED));
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		free(path);
		return rc;
	}
	rc = io_all(fd, NULL, value, len);
	if (close(fd) != 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) != 0)
		rc = -errno;
	if (rc < 0)
		unlink(tmp);
	free(path);
	return rc;
}

static int fs_remove(void *ctx, const char *key)
{
	char *path = key_path(ctx, key);
	int rc = 0;

	if (path == NULL)
		return -EINVAL;
	if (unlink(path) != 0 && errno != ENOENT)
		rc = -errno;
	free(path);
	return rc;
}

static int fs_list(void *ctx, const char *prefix, char ***keys, size_t *n)
{
	fs_ctx *c = ctx;
	DIR *d = opendir(c->dir);
	struct dirent *de;
	char **out = NULL;
	size_t cnt = 0, cap = 0;
	char key[1100];

	if (d == NULL)
		return -errno;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.' || unescape(de->d_name, key, sizeof key) != 0 ||
		    strncmp(key, prefix, strlen(prefix)) != 0)
			continue;
		if (cnt == cap) {
			cap = cap ? cap * 2 : 16;
			char **nw = realloc(out, cap * sizeof *out);
			if (nw == NULL)
				break;
			out = nw;
		}
		out[cnt] = strdup(key);
		if (out[cnt] != NULL)
			cnt++;
	}
	closedir(d);
	*keys = out;
	*n = cnt;
	return 0;
}

static const char *const fs_schemes[] = { "file", NULL };

static const te_metadata_ops fs_ops = {
	.size = sizeof(te_metadata_ops),
	.schemes = fs_schemes,
	.open = fs_open,
	.close = fs_close,
	.get = fs_get,
	.put = fs_put,
	.remove = fs_remove,
	.list = fs_list,
};

TE_PLUGIN_DEFINE(TE_KIND_METADATA, "filestore", "1.0.0",
		 "test fixture: a metadata store in a directory (file://<dir>)", "Apache-2.0", &fs_ops)
