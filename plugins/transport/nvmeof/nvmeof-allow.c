/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which paths the store may make this engine open: TE_NVMEOF_ALLOW lists
 * directories (regular files at or below them) and single files or devices
 * (exactly those). Paths are compared after realpath(), so neither ".." nor
 * a symlink leads out of a listed directory, and the open itself follows no
 * symlink, so one swapped in after the check is refused rather than followed.
 * Only regular files and block devices are opened at all: a FIFO could block,
 * and opening some character devices has side effects (a watchdog, a tape
 * that rewinds), so the type is checked before the open and again after.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef SYS_openat2
#include <linux/openat2.h>
#endif

#include "nvmeof.h"

char **nv_allow_parse(const te_host *h, const char *text)
{
	GPtrArray *out = g_ptr_array_new();

	if (text != NULL) {
		gchar **parts = g_strsplit(text, ":", -1);
		for (gchar **p = parts; *p != NULL; p++) {
			if (**p == '\0')
				continue;
			/* Relative to what? The engine's working directory is
			 * nobody's intent, so say so rather than guess. */
			if (**p != '/' || strlen(*p) >= PATH_MAX) {
				h->log(h, TE_LOG_WARN, "TE_NVMEOF_ALLOW: \"%s\" is not an absolute path; ignored",
				       *p);
				continue;
			}
			g_ptr_array_add(out, g_strdup(*p));
		}
		g_strfreev(parts);
	}
	g_ptr_array_add(out, NULL);
	return (char **)g_ptr_array_free(out, FALSE);
}

/* `p` is `dir` or lies below it; both canonical. */
static bool below(const char *p, const char *dir)
{
	size_t n = strlen(dir);

	if (n == 1 && dir[0] == '/')
		return p[0] == '/';
	return strncmp(p, dir, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

/* The canonical form of `path`: realpath() when it resolves. When it does
 * not (a file not there yet, a mount not made), the canonical form of its
 * longest ancestor that resolves with the rest appended, so the path is
 * judged by where it would be; NULL when that rest holds "." or "..", which
 * could lead anywhere once the missing parts appear. *err: why `path` itself
 * did not resolve (an errno), 0 when it did. */
static char *canonical(const char *path, int *err)
{
	char *rp = realpath(path, NULL);

	*err = 0;
	if (rp != NULL)
		return rp;
	*err = errno;
	char *abs;
	if (path[0] == '/') {
		abs = g_strdup(path);
	} else {
		char *cwd = g_get_current_dir();
		abs = g_build_filename(cwd, path, NULL);
		g_free(cwd);
	}
	char *res = NULL;
	for (size_t cut = strlen(abs); cut-- > 0;) {
		if (abs[cut] != '/')
			continue;
		abs[cut] = '\0';
		char *head = realpath(cut == 0 ? "/" : abs, NULL);
		abs[cut] = '/';
		if (head == NULL)
			continue;
		const char *rest = abs + cut + 1;
		bool dots = false;
		gchar **parts = g_strsplit(rest, "/", -1);
		for (gchar **q = parts; *q != NULL; q++)
			dots |= strcmp(*q, ".") == 0 || strcmp(*q, "..") == 0;
		g_strfreev(parts);
		if (!dots)
			res = g_strconcat(head, strcmp(head, "/") == 0 ? "" : "/", rest, NULL);
		free(head);
		break;
	}
	g_free(abs);
	if (res == NULL)
		return NULL;
	/* the caller frees realpath()'s memory and this alike */
	rp = strdup(res);
	g_free(res);
	return rp;
}

enum { MATCH_NONE, MATCH_DIR, MATCH_EXACT };

/* How `rp` (canonical) is allowed. Entries are resolved now, not at start:
 * a listed mount point may be mounted later. */
static int allow_match(char *const *allow, const char *rp)
{
	int best = MATCH_NONE;

	for (size_t i = 0; allow != NULL && allow[i] != NULL && best != MATCH_EXACT; i++) {
		char *er = realpath(allow[i], NULL);
		struct stat st;
		if (er == NULL)
			continue;
		if (stat(er, &st) == 0) {
			if (S_ISDIR(st.st_mode) && below(rp, er))
				best = MATCH_DIR;
			else if (!S_ISDIR(st.st_mode) && strcmp(rp, er) == 0)
				best = MATCH_EXACT;
		}
		free(er);
	}
	return best;
}

static const char *kind_of(mode_t m)
{
	return S_ISCHR(m)  ? "a character device"
	       : S_ISFIFO(m) ? "a FIFO"
	       : S_ISSOCK(m) ? "a socket"
	       : S_ISLNK(m)  ? "a symbolic link"
	       : S_ISDIR(m)  ? "a directory"
			     : "not a regular file";
}

int nv_path_check(nv_ctx *c, const char *path, char **resolved, struct stat *st, char *why, size_t whylen)
{
	int err = 0;
	char *rp = canonical(path, &err);
	const char *allow = c->allow_text != NULL && *c->allow_text != '\0' ? c->allow_text : NULL;
	char shown[PATH_MAX + 32] = "";
	int m;

	*resolved = NULL;
	if (rp != NULL && strcmp(rp, path) != 0)
		snprintf(shown, sizeof shown, " (resolves to %s)", rp);
	m = rp != NULL ? allow_match(c->allow, rp) : MATCH_NONE;
	if (m == MATCH_NONE) {
		if (allow == NULL)
			snprintf(why, whylen,
				 "TE_NVMEOF_ALLOW is unset, so this host serves no file; list the "
				 "directories and devices segments may use in TE_NVMEOF_ALLOW (engine "
				 "option or environment variable)");
		else
			snprintf(why, whylen,
				 "%s%s is outside TE_NVMEOF_ALLOW (%s); add its directory (or the "
				 "device itself) to TE_NVMEOF_ALLOW to serve it",
				 path, shown, allow);
		free(rp);
		return TE_ERR_REJECTED;
	}
	if (err != 0) {
		snprintf(why, whylen, "%s", g_strerror(err));
		free(rp);
		return -err;
	}
	if (lstat(rp, st) != 0) {
		err = errno;
		snprintf(why, whylen, "%s", g_strerror(err));
		free(rp);
		return -err;
	}
	if (S_ISDIR(st->st_mode)) {
		snprintf(why, whylen, "%s", g_strerror(EISDIR));
		free(rp);
		return -EISDIR;
	}
	if (!S_ISREG(st->st_mode) && !S_ISBLK(st->st_mode)) {
		snprintf(why, whylen, "%s%s is %s; only regular files and block devices are served", path,
			 shown, kind_of(st->st_mode));
		free(rp);
		return TE_ERR_REJECTED;
	}
	if (S_ISBLK(st->st_mode) && m != MATCH_EXACT) {
		/* A listed directory stands for the files in it: a whole disk
		 * is served only when named itself. */
		snprintf(why, whylen,
			 "%s%s is a block device, which TE_NVMEOF_ALLOW (%s) does not name itself; "
			 "a directory there allows regular files only",
			 path, shown, allow);
		free(rp);
		return TE_ERR_REJECTED;
	}
	*resolved = rp;
	return 0;
}

int nv_open_resolved(const char *rp, int flags, const struct stat *want)
{
	int fd = -1;
	bool strict = false;

	flags |= O_CLOEXEC | O_NOCTTY | O_NOFOLLOW;
#ifdef SYS_openat2
	/* No symlink anywhere on the way: rp is canonical, so one there now
	 * was swapped in after the check. */
	struct open_how how = { .flags = (uint64_t)flags,
				.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
	fd = (int)syscall(SYS_openat2, AT_FDCWD, rp, &how, sizeof how);
	if (fd >= 0)
		strict = true;
	else if (errno != ENOSYS && errno != EPERM)
		return -errno;
#endif
	if (fd < 0) {
		/* Kernels before 5.6 (or a seccomp filter without openat2):
		 * O_NOFOLLOW guards the last component, /proc below the rest. */
		fd = open(rp, flags);
		if (fd < 0)
			return -errno;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_dev != want->st_dev || st.st_ino != want->st_ino ||
	    (st.st_mode & S_IFMT) != (want->st_mode & S_IFMT)) {
		close(fd);
		return -ESTALE; /* replaced between the check and the open */
	}
	if (!strict) {
		char link[64], got[PATH_MAX];
		snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
		ssize_t n = readlink(link, got, sizeof got - 1);
		if (n >= 0) {
			got[n] = '\0';
			if (strcmp(got, rp) != 0) {
				close(fd);
				return -ESTALE;
			}
		}
	}
	return fd;
}

const char *nv_strerror(int err)
{
	if (err == TE_ERR_REJECTED)
		return "refused (outside TE_NVMEOF_ALLOW, or not a regular file or block device)";
	if (err == -ESTALE)
		return "the path changed while it was being opened";
	return g_strerror(-err);
}
