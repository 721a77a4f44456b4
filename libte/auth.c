/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer authentication: a mutual HMAC-SHA256 challenge-response over a
 * cluster secret (TE_AUTH_KEY_FILE), run on a fresh connection before
 * anything else crosses it. Used by the RPC socket (rpc.c) and, through the
 * te_host services, by transports for their own connections.
 *
 *   client → server  HELLO      header, nonce_c                 48 bytes
 *   server → client  CHALLENGE  header(status), nonce_s, mac_s  80 bytes
 *   client → server  PROOF      header, mac_c                   48 bytes
 *   server → client  RESULT     header(status)                  16 bytes
 *
 * header: magic "TE-AUTH\0", version, channel, status, 5 zero bytes.
 * mac_x = HMAC(key, "te-auth" | version | channel | direction | nonce_c | nonce_s)
 * with direction 'S' for the server's proof and 'C' for the client's: a
 * proof binds both fresh nonces (no replay onto another connection), one
 * direction (no reflection of the server's proof back as the client's) and
 * the channel kind (no RPC transcript accepted on a data port).
 *
 * The key file's key is proven; it and the keys of "<key file>.next" and
 * "<key file>.prev", while those files exist, are accepted. The files are
 * looked at again (at most once a second, as handshakes start), so the key
 * changes without a restart (docs/security.md). Each is read only when no
 * one but this user and root could have written it (util/teu-secret-file.h).
 *
 * Every message has a fixed size and every read a deadline. The magic's
 * bytes 4..7 are not zero, so its first 8 bytes read as a little-endian
 * frame length are far above any RPC frame limit: a server without a key
 * refuses a HELLO as an oversized frame at once, and a server with one tells
 * a plain RPC frame from a HELLO by its first 8 bytes.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "teu-secret-file.h"
#include "internal.h"

#define AUTH_VERSION 1
#define HDR 16
#define NONCE 32
#define MAC 32
#define MSG_HELLO (HDR + NONCE)
#define MSG_CHALLENGE (HDR + NONCE + MAC)
#define MSG_PROOF (HDR + MAC)
#define MSG_RESULT HDR
#define KEY_MIN 16
#define KEY_FILE_MAX 4096

enum { ST_OK = 0, ST_REFUSED = 1, ST_VERSION = 2, ST_CHANNEL = 3 };

static const uint8_t magic[8] = { 'T', 'E', '-', 'A', 'U', 'T', 'H', 0 };

/* A key as read from its file. */
typedef struct auth_key {
	size_t len; /* 0: none */
	uint8_t key[KEY_FILE_MAX];
} auth_key;

/* What a file looked like when last read: a change of any of these (a
 * rename over it, a rewrite) makes it read again. */
typedef struct file_id {
	bool exists;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime, ctime; /* ctime: a chmod or chown is judged again */
	ino_t link_ino;               /* the name itself (lstat): a symlink swapped, */
	struct timespec link_ctime;   /* or chowned, is judged again too */
} file_id;

/* The key files: the key file itself, then the ones whose keys are
 * accepted too while they exist. */
enum { KF_CUR, KF_NEXT, KF_PREV, KF_N };
static const char *const kf_suffix[KF_N] = { "", ".next", ".prev" };

/* The keys and what may change them while handshakes run. */
typedef struct keyring {
	GMutex lock;
	auth_key k[KF_N]; /* [KF_CUR] proven with; all accepted (len 0: none) */
	file_id id[KF_N];
	int64_t checked_ms;
} keyring;

struct te_auth {
	char *path[KF_N];
	keyring *ring; /* apart, so that a const te_auth still reloads */
};

/* A handshake's copy of the keys: [0] the current one, then the others. */
typedef struct keyset {
	int n;
	auth_key k[KF_N];
} keyset;

#define RELOAD_CHECK_MS 1000 /* files are looked at this often, at most */

/* ------------------------------------------------------------- the key */

/* `st`: the file `path` names, symlinks followed. */
static void file_id_of(const char *path, const struct stat *st, file_id *id)
{
	struct stat ls;

	*id = (file_id){ .exists = true, .dev = st->st_dev, .ino = st->st_ino, .size = st->st_size,
			 .mtime = st->st_mtim, .ctime = st->st_ctim };
	if (lstat(path, &ls) == 0) {
		id->link_ino = ls.st_ino;
		id->link_ctime = ls.st_ctim;
	}
}

static bool file_id_same(const file_id *a, const file_id *b)
{
	return a->exists == b->exists && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
	       a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
	       a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec &&
	       a->link_ino == b->link_ino && a->link_ctime.tv_sec == b->link_ctime.tv_sec &&
	       a->link_ctime.tv_nsec == b->link_ctime.tv_nsec;
}

/* Reads the key in `path` into `out`. -ENOENT when there is no such file,
 * -EINVAL (logged at `level`, naming the file, never the key) when it is
 * unusable or refused: one that someone other than this user or root could
 * have written or put there (util/teu-secret-file.h). `id`: what the file was when
 * read, set when it could be opened. */
static int read_key(const char *path, auth_key *out, file_id *id, int level)
{
	struct stat st;
	char buf[KEY_FILE_MAX + 1], why[PATH_MAX + 256];
	size_t n = 0;
	int fd, rc;

	*id = (file_id){ 0 };
	fd = teu_secret_open(path, &st, why, sizeof why);
	if (fd == -ENOENT)
		return -ENOENT;
	if (fd == -EPERM) {
		te_log(level, TE_DOMAIN, "auth: refused the key file %s: %s", path, why);
		return -EINVAL;
	}
	if (fd < 0) {
		te_log(level, TE_DOMAIN, "auth: cannot read the key file %s: %s", path, why);
		return -EINVAL;
	}
	file_id_of(path, &st, id);
	rc = teu_secret_read(fd, buf, sizeof buf, &n);
	close(fd);
	if (rc < 0) {
		explicit_bzero(buf, sizeof buf);
		te_log(level, TE_DOMAIN, "auth: cannot read the key file %s: %s", path, g_strerror(-rc));
		return -EINVAL;
	}
	if (n > KEY_FILE_MAX) {
		explicit_bzero(buf, sizeof buf);
		te_log(level, TE_DOMAIN, "auth: the key file %s is larger than %d bytes", path, KEY_FILE_MAX);
		return -EINVAL;
	}
	/* A trailing newline (echo > file) is not part of the secret. */
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		n--;
	if (n < KEY_MIN) {
		explicit_bzero(buf, sizeof buf);
		te_log(level, TE_DOMAIN, "auth: the key in %s is %zu bytes long; at least %d are needed", path, n,
		       KEY_MIN);
		return -EINVAL;
	}
	if (st.st_mode & (S_IRGRP | S_IROTH))
		te_warn("auth: the key file %s is readable by its group or by others (mode %03o); "
			"chmod 600 it", path, (unsigned)(st.st_mode & 0777));
	memcpy(out->key, buf, n);
	out->len = n;
	explicit_bzero(buf, sizeof buf);
	return 0;
}

int te_auth_load(const char *path, te_auth **out)
{
	*out = NULL;
	if (path == NULL || *path == '\0') {
		te_err("auth: empty key file name (TE_AUTH_KEY_FILE)");
		return -EINVAL;
	}
	te_auth *a = g_new0(te_auth, 1);
	a->ring = g_new0(keyring, 1);
	g_mutex_init(&a->ring->lock);
	for (int i = 0; i < KF_N; i++)
		a->path[i] = g_strconcat(path, kf_suffix[i], NULL);
	/* The key file must be there; .next and .prev only when they are, but
	 * then they must hold keys as it does. */
	for (int i = 0; i < KF_N; i++) {
		int rc = read_key(a->path[i], &a->ring->k[i], &a->ring->id[i], TE_LOG_ERROR);
		if (rc == -ENOENT && i == KF_CUR)
			te_err("auth: cannot open the key file %s (TE_AUTH_KEY_FILE): %s", path, g_strerror(ENOENT));
		if (rc == -EINVAL || (rc < 0 && i == KF_CUR)) {
			te_auth_free(a);
			return -EINVAL;
		}
	}
	a->ring->checked_ms = te_now_ms();
	*out = a;
	te_info("auth: peers must prove the key of %s%s%s", path, a->ring->k[KF_NEXT].len ? " or of its .next file" : "",
		a->ring->k[KF_PREV].len ? " or of its .prev file" : "");
	return 0;
}

void te_auth_free(te_auth *a)
{
	if (a == NULL)
		return;
	if (a->ring != NULL) {
		g_mutex_clear(&a->ring->lock);
		explicit_bzero(a->ring, sizeof *a->ring);
		g_free(a->ring);
	}
	for (int i = 0; i < KF_N; i++)
		g_free(a->path[i]);
	g_free(a);
}

/* Whether `path` is not what `seen` says; then it is read into `tmp`
 * (*rc: read_key's) and `seen` updated, also when it was refused, so that
 * a refused file is reported once, not at every look. */
static bool reread(const char *path, file_id *seen, auth_key *tmp, int *rc)
{
	struct stat st;
	file_id id = { 0 };

	if (stat(path, &st) == 0)
		file_id_of(path, &st, &id);
	if (file_id_same(&id, seen))
		return false;
	*rc = read_key(path, tmp, seen, TE_LOG_WARN);
	if (*rc == -EINVAL && !seen->exists)
		*seen = id;
	return true;
}

/* Reads the key files again where they changed (ring locked): the key
 * file's key is proven from then on, the others' accepted as well while
 * they exist. A file that does not read as a key, or is refused, leaves the
 * key it had (logged): a half-written file never locks the engine out, and
 * a planted one never gets in. */
static void reload_locked(const te_auth *a)
{
	keyring *r = a->ring;
	auth_key *tmp = g_new0(auth_key, 1);
	int rc;

	for (int i = 0; i < KF_N; i++) {
		const char *p = a->path[i];
		if (!reread(p, &r->id[i], tmp, &rc))
			continue;
		if (rc == 0) {
			r->k[i] = *tmp;
			if (i == KF_CUR)
				te_info("auth: %s changed: this engine proves its new key from now on", p);
			else
				te_info("auth: %s: its key is accepted too from now on", p);
		} else if (rc == -ENOENT && i != KF_CUR) {
			explicit_bzero(&r->k[i], sizeof r->k[i]);
			te_info("auth: %s is gone: its key is no longer accepted", p);
		} else {
			te_warn("auth: %s changed but holds no usable key%s: the key read before stays", p,
				rc == -ENOENT ? " (removed)" : "");
		}
	}
	explicit_bzero(tmp, sizeof *tmp);
	g_free(tmp);
}

/* The keys for one handshake, the files looked at again first (at most
 * once a RELOAD_CHECK_MS); keys_drop() wipes them. */
static keyset *keys_take(const te_auth *a)
{
	keyring *r = a->ring;
	keyset *ks = g_new(keyset, 1);

	g_mutex_lock(&r->lock);
	int64_t now = te_now_ms();
	if (now - r->checked_ms >= RELOAD_CHECK_MS) {
		r->checked_ms = now;
		reload_locked(a);
	}
	ks->n = 0;
	for (int i = 0; i < KF_N; i++) {
		const auth_key *k = &r->k[i];
		bool dup = k->len == 0;
		for (int j = 0; j < ks->n && !dup; j++)
			dup = ks->k[j].len == k->len && memcmp(ks->k[j].key, k->key, k->len) == 0;
		if (!dup)
			ks->k[ks->n++] = *k;
	}
	g_mutex_unlock(&r->lock);
	return ks;
}

static void keys_drop(keyset *ks)
{
	explicit_bzero(ks, sizeof *ks);
	g_free(ks);
}

/* ------------------------------------------------------------ messages */

static void hdr_put(uint8_t *m, int channel, int status)
{
	memset(m, 0, HDR);
	memcpy(m, magic, 8);
	m[8] = AUTH_VERSION;
	m[9] = (uint8_t)channel;
	m[10] = (uint8_t)status;
}

static void mac_of(const auth_key *k, int channel, char dir, const uint8_t *nc, const uint8_t *ns,
		   uint8_t out[MAC])
{
	static const char label[] = "te-auth";
	uint8_t meta[3] = { AUTH_VERSION, (uint8_t)channel, (uint8_t)dir };
	GHmac *h = g_hmac_new(G_CHECKSUM_SHA256, k->key, k->len);
	gsize len = MAC;

	g_hmac_update(h, (const guchar *)label, sizeof label - 1);
	g_hmac_update(h, meta, sizeof meta);
	g_hmac_update(h, nc, NONCE);
	g_hmac_update(h, ns, NONCE);
	g_hmac_get_digest(h, out, &len);
	g_hmac_unref(h);
}

/* Compares in time independent of where the bytes differ. */
static bool same(const uint8_t *x, const uint8_t *y, size_t n)
{
	volatile uint8_t d = 0;
	for (size_t i = 0; i < n; i++)
		d |= x[i] ^ y[i];
	return d == 0;
}

static int fresh_nonce(uint8_t *n)
{
	size_t got = 0;
	while (got < NONCE) {
		ssize_t r = getrandom(n + got, NONCE - got, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			te_err("auth: getrandom failed: %s", g_strerror(errno));
			return -EIO;
		}
		got += (size_t)r;
	}
	return 0;
}

/* ------------------------------------------------------------- exchange */

static int64_t bound(int timeout_ms)
{
	if (timeout_ms <= 0 || timeout_ms > TE_AUTH_TIMEOUT_MS)
		timeout_ms = TE_AUTH_TIMEOUT_MS;
	return te_now_ms() + timeout_ms;
}

static const char *channel_name(int channel)
{
	switch (channel) {
	case TE_AUTH_RPC: return "RPC";
	case TE_AUTH_TCP: return "TCP data";
	default: return "transport";
	}
}

/* Refusals are rate-limited, with how many were held back: a flood of bad
 * peers must not become a flood of log lines. */
static void refused(const char *peer, int channel, const char *why)
{
	te_warn_limited("auth: refused %s connection from %s: %s", channel_name(channel), peer, why);
}

/* ------------------------------------------------------------- client */

/* The server proves one of its keys; this side answers with the key of
 * its own that matched, so either side may have taken up a new key first
 * as long as the other accepts it (its .next file). */
static int client(const keyset *ks, int fd, int channel, const char *peer, int timeout_ms)
{
	uint8_t hello[MSG_HELLO], ch[MSG_CHALLENGE], proof[MSG_PROOF], res[MSG_RESULT], want[MAC];
	int64_t deadline = bound(timeout_ms);
	int rc;

	hdr_put(hello, channel, ST_OK);
	if ((rc = fresh_nonce(hello + HDR)) < 0)
		return rc;
	rc = te_fd_write(fd, hello, sizeof hello, deadline);
	if (rc == 0)
		rc = te_fd_read(fd, ch, sizeof ch, deadline);
	if (rc == -ECONNRESET || rc == -EPIPE) {
		te_err("auth: %s closed the %s connection instead of answering the authentication: it "
		       "has no key (TE_AUTH_KEY_FILE) or does not authenticate", peer, channel_name(channel));
		return TE_ERR_AUTH;
	}
	if (rc < 0) {
		te_err("auth: %s did not answer the authentication of a %s connection: %s", peer,
		       channel_name(channel), te_strerror(rc));
		return rc == -ETIMEDOUT ? TE_ERR_AUTH : rc;
	}
	if (memcmp(ch, magic, 8) != 0) {
		te_err("auth: %s answered the authentication with something else: it does not authenticate",
		       peer);
		return TE_ERR_AUTH;
	}
	if (ch[10] != ST_OK) {
		te_err("auth: %s refused to authenticate a %s connection (%s)", peer, channel_name(channel),
		       ch[10] == ST_VERSION ? "protocol version" : ch[10] == ST_CHANNEL ? "channel" : "refused");
		return TE_ERR_AUTH;
	}
	const auth_key *k = NULL;
	for (int i = 0; i < ks->n && k == NULL && ch[8] == AUTH_VERSION && ch[9] == channel; i++) {
		mac_of(&ks->k[i], channel, 'S', hello + HDR, ch + HDR, want);
		if (same(want, ch + HDR + NONCE, MAC))
			k = &ks->k[i];
	}
	if (k == NULL || same(hello + HDR, ch + HDR, NONCE)) {
		te_err("auth: %s could not prove the cluster key (TE_AUTH_KEY_FILE differs?)", peer);
		return TE_ERR_AUTH;
	}
	hdr_put(proof, channel, ST_OK);
	mac_of(k, channel, 'C', hello + HDR, ch + HDR, proof + HDR);
	rc = te_fd_write(fd, proof, sizeof proof, deadline);
	if (rc == 0)
		rc = te_fd_read(fd, res, sizeof res, deadline);
	if (rc < 0 || memcmp(res, magic, 8) != 0 || res[10] != ST_OK) {
		te_err("auth: %s refused this engine's key (TE_AUTH_KEY_FILE differs?)", peer);
		return TE_ERR_AUTH;
	}
	return 0;
}

int te_auth_client(const te_auth *a, int fd, int channel, const char *peer, int timeout_ms)
{
	if (a == NULL)
		return 0;
	if (fd < 0 || channel <= 0 || channel > 255)
		return -EINVAL;
	keyset *ks = keys_take(a);
	int rc = client(ks, fd, channel, peer ? peer : "?", timeout_ms);
	keys_drop(ks);
	return rc;
}

/* ------------------------------------------------------------- server */

/* Proves the current key; accepts a proof of any key it holds. */
static int server(const keyset *ks, int fd, int channel, const char *peer, int timeout_ms, uint8_t first[8],
		  bool *plain)
{
	uint8_t hello[MSG_HELLO], ch[MSG_CHALLENGE], proof[MSG_PROOF], res[MSG_RESULT], want[MAC];
	int64_t deadline = bound(timeout_ms);
	int rc;

	rc = te_fd_read(fd, hello, 8, deadline);
	if (rc < 0) {
		refused(peer, channel, rc == -ETIMEDOUT ? "silent" : "closed before authenticating");
		return TE_ERR_AUTH;
	}
	if (memcmp(hello, magic, 8) != 0) {
		if (first)
			memcpy(first, hello, 8);
		if (plain)
			*plain = true;
		refused(peer, channel, "it did not authenticate (no key?)");
		return TE_ERR_AUTH;
	}
	rc = te_fd_read(fd, hello + 8, sizeof hello - 8, deadline);
	if (rc < 0) {
		refused(peer, channel, "incomplete authentication");
		return TE_ERR_AUTH;
	}
	int status = hello[8] != AUTH_VERSION ? ST_VERSION : hello[9] != channel ? ST_CHANNEL : ST_OK;
	hdr_put(ch, channel, status);
	memset(ch + HDR, 0, NONCE + MAC);
	if (status == ST_OK) {
		if ((rc = fresh_nonce(ch + HDR)) < 0)
			return rc;
		mac_of(&ks->k[0], channel, 'S', hello + HDR, ch + HDR, ch + HDR + NONCE);
	}
	rc = te_fd_write(fd, ch, sizeof ch, deadline);
	if (status != ST_OK) {
		refused(peer, channel, status == ST_VERSION ? "unknown protocol version" : "wrong channel");
		return TE_ERR_AUTH;
	}
	if (rc == 0)
		rc = te_fd_read(fd, proof, sizeof proof, deadline);
	if (rc < 0 || memcmp(proof, magic, 8) != 0) {
		refused(peer, channel, "incomplete authentication");
		return TE_ERR_AUTH;
	}
	bool ok = false;
	for (int i = 0; i < ks->n && !ok; i++) {
		mac_of(&ks->k[i], channel, 'C', hello + HDR, ch + HDR, want);
		ok = same(want, proof + HDR, MAC);
	}
	hdr_put(res, channel, ok ? ST_OK : ST_REFUSED);
	/* The verdict is sent either way, so a wrong-keyed client can say why. */
	rc = te_fd_write(fd, res, sizeof res, deadline);
	if (!ok) {
		refused(peer, channel, "wrong key");
		return TE_ERR_AUTH;
	}
	return rc < 0 ? rc : 0;
}

int te_auth_server(const te_auth *a, int fd, int channel, const char *peer, int timeout_ms,
		   uint8_t first[8], bool *plain)
{
	if (plain)
		*plain = false;
	if (a == NULL)
		return 0;
	if (fd < 0 || channel <= 0 || channel > 255)
		return -EINVAL;
	keyset *ks = keys_take(a);
	int rc = server(ks, fd, channel, peer ? peer : "?", timeout_ms, first, plain);
	keys_drop(ks);
	return rc;
}
