/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "teu-secret-file.h"

static int teu_secret__refuse(char *why, size_t whylen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int teu_secret__refuse(char *why, size_t whylen, int rc, const char *fmt, ...)
{
	va_list ap;
	if (why != NULL && whylen > 0) {
		va_start(ap, fmt);
		vsnprintf(why, whylen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

static bool teu_secret__owner_ok(uid_t uid)
{
	return uid == geteuid() || uid == 0;
}

/* Opens `path` for reading under the rule above. Returns the descriptor
 * (close-on-exec; `st` holds its fstat), or: -ENOENT when there is no such
 * file, -EPERM when the rule refuses it, another -errno when it cannot be
 * opened or is not a regular file. On every error `why` says why, naming the
 * path, owner and mode at fault (never the contents). */
int teu_secret_open(const char *path, struct stat *st, char *why, size_t whylen)
{
	/* cur: the name being judged; buf: its directory, then a link's target. */
	char *cur = malloc(PATH_MAX), *buf = malloc(PATH_MAX);
	int rc = -ENOMEM;

	if (cur == NULL || buf == NULL) {
		teu_secret__refuse(why, whylen, rc, "out of memory");
		goto out;
	}
	if (path == NULL || strlen(path) >= PATH_MAX) {
		rc = teu_secret__refuse(why, whylen, -ENAMETOOLONG, "the file name is empty or too long");
		goto out;
	}
	strcpy(cur, path);
	for (int links = 0;; links++) {
		const char *slash = strrchr(cur, '/'), *base = slash ? slash + 1 : cur;
		struct stat ds, ls;

		if (slash == NULL)
			strcpy(buf, ".");
		else if (slash == cur)
			strcpy(buf, "/");
		else
			snprintf(buf, PATH_MAX, "%.*s", (int)(slash - cur), cur);
		if (*base == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
			rc = teu_secret__refuse(why, whylen, -EISDIR, "%s names a directory, not a file", cur);
			goto out;
		}
		int dfd = open(buf, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0) {
			rc = -errno;
			teu_secret__refuse(why, whylen, rc, "cannot open %s, the directory of %s: %s", buf, cur,
					  strerror(-rc));
			goto out;
		}
		if (fstat(dfd, &ds) < 0) {
			rc = -errno;
			teu_secret__refuse(why, whylen, rc, "cannot look at %s: %s", buf, strerror(-rc));
			close(dfd);
			goto out;
		}
		bool dir_open = (ds.st_mode & (S_IWGRP | S_IWOTH)) != 0, sticky = (ds.st_mode & S_ISVTX) != 0;
		if (!teu_secret__owner_ok(ds.st_uid)) {
			rc = teu_secret__refuse(why, whylen, -EPERM,
					       "its directory %s is owned by uid %u (mode %04o), not by this process's "
					       "uid %u or root: its owner could put any file there",
					       buf, (unsigned)ds.st_uid, (unsigned)(ds.st_mode & 07777),
					       (unsigned)geteuid());
			close(dfd);
			goto out;
		}
		if (dir_open && !sticky) {
			rc = teu_secret__refuse(why, whylen, -EPERM,
					       "its directory %s (uid %u, mode %04o) can be written by %s and is not "
					       "sticky: anyone there could put a file in its place",
					       buf, (unsigned)ds.st_uid, (unsigned)(ds.st_mode & 07777),
					       (ds.st_mode & S_IWOTH) ? "others" : "its group");
			close(dfd);
			goto out;
		}
		int fd = openat(dfd, base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
		if (fd < 0 && errno == ELOOP && fstatat(dfd, base, &ls, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISLNK(ls.st_mode)) {
			/* In a sticky directory others cannot replace a link of ours
			 * or root's, so reading it after the check reads the same. */
			if (dir_open && !teu_secret__owner_ok(ls.st_uid)) {
				rc = teu_secret__refuse(why, whylen, -EPERM,
						       "%s is a symlink owned by uid %u in %s (uid %u, mode %04o), a "
						       "directory others can write: only links of uid %u or root are "
						       "followed there",
						       cur, (unsigned)ls.st_uid, buf, (unsigned)ds.st_uid,
						       (unsigned)(ds.st_mode & 07777), (unsigned)geteuid());
				close(dfd);
				goto out;
			}
			if (links >= TEU_SECRET_MAX_LINKS) {
				rc = teu_secret__refuse(why, whylen, -ELOOP, "%s: more than %d symlinks", path,
						       TEU_SECRET_MAX_LINKS);
				close(dfd);
				goto out;
			}
			char *target = malloc(PATH_MAX);
			ssize_t n = target ? readlinkat(dfd, base, target, PATH_MAX) : -1;
			int e = target ? errno : ENOMEM;
			close(dfd);
			if (n < 0 || n >= PATH_MAX) {
				rc = n < 0 ? -e : -ENAMETOOLONG;
				teu_secret__refuse(why, whylen, rc, "cannot read the symlink %s: %s", cur, strerror(-rc));
				free(target);
				goto out;
			}
			target[n] = '\0';
			/* A relative target is relative to the link's directory. */
			int len = target[0] == '/' ? snprintf(buf, PATH_MAX, "%s", target)
						    : snprintf(buf, PATH_MAX, "%.*s%s", (int)(base - cur), cur, target);
			free(target);
			if (len < 0 || len >= PATH_MAX) {
				rc = teu_secret__refuse(why, whylen, -ENAMETOOLONG, "the target of %s is too long", cur);
				goto out;
			}
			strcpy(cur, buf);
			continue;
		}
		if (fd < 0) {
			rc = -errno;
			teu_secret__refuse(why, whylen, rc, "cannot open %s: %s", cur, strerror(-rc));
			close(dfd);
			goto out;
		}
		close(dfd);
		if (fstat(fd, st) < 0) {
			rc = -errno;
			teu_secret__refuse(why, whylen, rc, "cannot look at %s: %s", cur, strerror(-rc));
		} else if (!S_ISREG(st->st_mode)) {
			rc = teu_secret__refuse(why, whylen, -EINVAL, "%s is not a regular file", cur);
		} else if (!teu_secret__owner_ok(st->st_uid)) {
			rc = teu_secret__refuse(why, whylen, -EPERM,
					       "%s is owned by uid %u (mode %04o), not by this process's uid %u or root",
					       cur, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777),
					       (unsigned)geteuid());
		} else if (st->st_mode & (S_IWGRP | S_IWOTH)) {
			rc = teu_secret__refuse(why, whylen, -EPERM, "%s (uid %u, mode %04o) can be written by %s",
					       cur, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777),
					       (st->st_mode & S_IWOTH) ? "others" : "its group");
		} else if (dir_open && st->st_nlink != 1) {
			rc = teu_secret__refuse(why, whylen, -EPERM,
					       "%s has %lu links in %s (mode %04o), a directory others can write: "
					       "one of them may not be its owner's",
					       cur, (unsigned long)st->st_nlink, buf, (unsigned)(ds.st_mode & 07777));
		} else {
			rc = fd;
			goto out;
		}
		close(fd);
		goto out;
	}
out:
	free(cur);
	free(buf);
	return rc;
}

/* Reads up to `cap` bytes of `fd` into `buf` (*n: how many; cap of them
 * means there may be more). 0, or -errno. */
int teu_secret_read(int fd, char *buf, size_t cap, size_t *n)
{
	*n = 0;
	while (*n < cap) {
		ssize_t r = read(fd, buf + *n, cap - *n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		*n += (size_t)r;
	}
	return 0;
}
