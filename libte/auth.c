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
 * The key file's key is proven; it and the key of "<key file>.next", while
 * that file exists, are accepted. Both files are looked at again (at most
 * once a second, as handshakes start), so the key changes without a
 * restart (docs/security.md).
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
	struct timespec mtime;
} file_id;

/* The keys and what may change them while handshakes run. */
typedef struct keyring {
	GMutex lock;
	auth_key cur;  /* proven with, and accepted */
	auth_key next; /* accepted too, while <key file>.next exists */
	file_id cur_id, next_id;
	int64_t checked_ms;
} keyring;

struct te_auth {
	char *path, *next_path;
	keyring *ring; /* apart, so that a const te_auth still reloads */
};

/* A handshake's copy of the keys: [0] the current one, [1] the next. */
typedef struct keyset {
	int n;
	auth_key k[2];
} keyset;

#define RELOAD_CHECK_MS 1000 /* files are looked at this often, at most */

/* ------------------------------------------------------------- the key */

static void file_id_of(const struct stat *st, file_id *id)
{
	*id = (file_id){ .exists = true, .dev = st->st_dev, .ino = st->st_ino, .size = st->st_size,
			 .mtime = st->st_mtim };
}

static bool file_id_same(const file_id *a, const file_id *b)
{
	return a->exists == b->exists && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
	       a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* Reads the key in `path` into `out`. -ENOENT when there is no such file,
 * -EINVAL (logged at `level`, naming the file, never the key) when it is
 * unusable. `id`: what the file was when read, set even on -EINVAL. */
static int read_key(const char *path, auth_key *out, file_id *id, int level)
{
	struct stat st;
	char buf[KEY_FILE_MAX + 1];
	size_t n = 0;
	int fd;

	*id = (file_id){ 0 };
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return -ENOENT;
		te_log(level, TE_DOMAIN, "auth: cannot open the key file %s: %s", path, g_strerror(errno));
		return -EINVAL;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		te_log(level, TE_DOMAIN, "auth: the key file %s is not a regular file", path);
		close(fd);
		return -EINVAL;
	}
	file_id_of(&st, id);
	while (n < sizeof buf) {
		ssize_t r = read(fd, buf + n, sizeof buf - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			te_log(level, TE_DOMAIN, "auth: cannot read the key file %s: %s", path, g_strerror(errno));
			close(fd);
			return -EINVAL;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
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
	auth_key *k;
	file_id id;

	*out = NULL;
	if (path == NULL || *path == '\0') {
		te_err("auth: empty key file name (TE_AUTH_KEY_FILE)");
		return -EINVAL;
	}
	te_auth *a = g_new0(te_auth, 1);
	a->ring = g_new0(keyring, 1);
	g_mutex_init(&a->ring->lock);
	a->path = g_strdup(path);
	a->next_path = g_strconcat(path, ".next", NULL);
	k = &a->ring->cur;
	int rc = read_key(path, k, &id, TE_LOG_ERROR);
	if (rc == -ENOENT)
		te_err("auth: cannot open the key file %s (TE_AUTH_KEY_FILE): %s", path, g_strerror(ENOENT));
	if (rc < 0) {
		te_auth_free(a);
		return -EINVAL;
	}
	a->ring->cur_id = id;
	rc = read_key(a->next_path, &a->ring->next, &id, TE_LOG_ERROR);
	if (rc == -EINVAL) {
		te_auth_free(a);
		return -EINVAL;
	}
	a->ring->next_id = id;
	a->ring->checked_ms = te_now_ms();
	*out = a;
	te_info("auth: peers must prove the key of %s%s", path,
		a->ring->next.len ? " or of its .next file" : "");
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
	g_free(a->path);
	g_free(a->next_path);
	g_free(a);
}

/* Reads the key files again where they changed (ring locked): the key
 * file's key is proven from then on, the .next file's accepted as well
 * while it exists. A file that does not read as a key leaves the key it
 * had (logged): a half-written file never locks the engine out. */
/* Whether `path` is not what `seen` says; then it is read into `tmp`
 * (*rc: read_key's) and `seen` updated. */
static bool reread(const char *path, file_id *seen, auth_key *tmp, int *rc)
{
	struct stat st;
	file_id id = { 0 };

	if (stat(path, &st) == 0)
		file_id_of(&st, &id);
	if (file_id_same(&id, seen))
		return false;
	*rc = read_key(path, tmp, seen, TE_LOG_WARN);
	return true;
}

static void reload_locked(const te_auth *a)
{
	keyring *r = a->ring;
	auth_key *tmp = g_new0(auth_key, 1);
	int rc;

	if (reread(a->path, &r->cur_id, tmp, &rc)) {
		if (rc == 0) {
			r->cur = *tmp;
			te_info("auth: %s changed: this engine proves its new key from now on", a->path);
		} else {
			te_warn("auth: %s changed but holds no usable key%s: the key read before stays", a->path,
				rc == -ENOENT ? " (removed)" : "");
		}
	}
	if (reread(a->next_path, &r->next_id, tmp, &rc)) {
		if (rc == 0) {
			r->next = *tmp;
			te_info("auth: %s: its key is accepted too from now on", a->next_path);
		} else if (rc == -ENOENT) {
			explicit_bzero(&r->next, sizeof r->next);
			te_info("auth: %s is gone: only the key of %s is accepted now", a->next_path, a->path);
		} else {
			te_warn("auth: %s changed but holds no usable key: the key read before stays", a->next_path);
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
	ks->k[0] = r->cur;
	ks->n = 1;
	if (r->next.len > 0)
		ks->k[ks->n++] = r->next;
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
