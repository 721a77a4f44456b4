/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Opening a file that holds a secret (the cluster key and its .next and
 * .prev files, bearer tokens) only when no one but this process's user and
 * root can have written it. A key that anyone could plant is a key anyone
 * holds: a file in /tmp, or in a shared folder, would let every local user
 * prove the cluster key. The rule (docs/security.md, "Key and token files"):
 *
 *  - the directory the file is in is owned by the effective user or root,
 *    and is not writable by its group or others, unless it is sticky (as
 *    /tmp is: there others may add names but not replace ours);
 *  - the file is a regular file owned by the effective user or root, not
 *    writable by its group or others; in a sticky directory others can
 *    write, it also has a single link (no one else's hard link to some
 *    file of ours that they can read);
 *  - a symlink as the last component is followed only where a file would
 *    be taken: in a directory only the user and root can write, or, in a
 *    sticky one, when the link is owned by the user or root. Its target is
 *    judged again by the same rule (at most TEU_SECRET_MAX_LINKS links).
 *
 * The directory is opened and checked first (fstat on its descriptor); the
 * file is opened relative to that descriptor without following a symlink
 * and the opened file is checked (fstat), so nothing can be swapped between
 * the check and the read. Directories above the file's own are not judged.
 * POSIX and Linux (O_PATH) only, no GLib: libte links it too.
 */
#ifndef TEU_SECRET_FILE_H
#define TEU_SECRET_FILE_H

#include <stddef.h>
#include <sys/stat.h>

#define TEU_SECRET_MAX_LINKS 8

/* Opens `path` for reading under the rule above. Returns the descriptor
 * (close-on-exec; `st` holds its fstat), or: -ENOENT when there is no such
 * file, -EPERM when the rule refuses it, another -errno when it cannot be
 * opened or is not a regular file. On every error `why` says why, naming the
 * path, owner and mode at fault (never the contents). */
int teu_secret_open(const char *path, struct stat *st, char *why, size_t whylen);

/* Reads up to `cap` bytes of `fd` into `buf` (*n: how many; cap of them
 * means there may be more). 0, or -errno. */
int teu_secret_read(int fd, char *buf, size_t cap, size_t *n);

#endif
