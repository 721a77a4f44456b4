/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer authentication (TE_AUTH_KEY_FILE) end to end: a target engine with the
 * key in a process of its own (tcp-peer), initiators in this process.
 *
 *   test-auth TCP_PEER [TE_METADATA_SERVER]
 *
 * With the right key transfers work over TCP. A wrong key, no key, a
 * replayed handshake, a raw TCP data request without a handshake, a keyed
 * initiator against a key-less target: each refused quickly with
 * TE_ERR_AUTH or a closed connection, the refusals in the target's log, and
 * the target goes on serving the right-keyed peer. With a store: an engine
 * without the key fails at te_segment_open from the descriptor alone.
 */
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tcp/peer-target.h"

#define FAST_MS 1000 /* "fails fast": well under any timeout */

static const char *peer_bin, *mds_bin;
static char dir[] = "/tmp/te-auth-XXXXXX";
static char key_a[128], key_b[128], key_short[128], key_open[128], target_log[128];

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	REQUIRE(f != NULL);
	fputs(text, f);
	fclose(f);
	REQUIRE(chmod(path, mode) == 0);
}

static te_engine *engine_with_key(const char *key)
{
	te_option o = { "auth_key_file", key };
	return tcp_engine(&o, key ? 1 : 0);
}

static void target_start(target *t, const char *key, const char *log)
{
	char env_key[160];
	snprintf(env_key, sizeof env_key, "TE_AUTH_KEY_FILE=%s", key ? key : "");
	char *env[] = { env_key, NULL };
	peer_target_start(t, peer_bin, env, log);
}

static bool transfers_work(te_engine *e, const target *t, unsigned seed)
{
	return peer_target_transfers(e, t, seed);
}

/* te_segment_open(e, name) fails with TE_ERR_AUTH within FAST_MS. */
static void open_refused(te_engine *e, const char *name, const char *what)
{
	long long t0 = now_ms();
	int rc = te_segment_open(e, name);
	long long dt = now_ms() - t0;
	fprintf(stderr, "  %s: %s after %lld ms\n", what, te_strerror(rc), dt);
	CHECK_EQ(rc, TE_ERR_AUTH);
	CHECK(dt < FAST_MS);
}

/* --------------------------------------------------------------- keys */

static void test_key_files(void)
{
	te_engine *e = NULL;

	cap_start();
	CHECK(engine_with_key(key_short) == NULL);
	CHECK(cap_has(key_short));
	CHECK(cap_has("at least 16"));
	CHECK(!cap_has_quiet("tooshort")); /* the secret itself never */
	te_option o[2] = { { "transports", "tcp" }, { "auth_key_file", "/nonexistent/te.key" } };
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "127.0.0.1", o, 2, &e), -EINVAL);
	CHECK(cap_has("/nonexistent/te.key"));

	/* Readable by others: works, with a warning. */
	cap_start();
	e = engine_with_key(key_open);
	CHECK(e != NULL);
	CHECK(cap_has("readable by its group or by others"));
	te_engine_destroy(e);

	/* A transport from before ABI 1.2 cannot authenticate: refused with a key. */
	e = engine_with_key(key_a);
	REQUIRE(e != NULL);
	cap_start();
	CHECK_EQ(te_transport_install(e, "oldabi", NULL), -ENOTSUP);
	CHECK(cap_has("before peer authentication"));
	te_engine_destroy(e);
	e = engine_with_key(NULL);
	REQUIRE(e != NULL);
	CHECK_EQ(te_transport_install(e, "oldabi", NULL), 0);
	te_engine_destroy(e);

	/* The environment variable, when no option says otherwise. */
	setenv("TE_AUTH_KEY_FILE", key_short, 1);
	CHECK(engine_with_key(NULL) == NULL);
	unsetenv("TE_AUTH_KEY_FILE");
	te_set_log_handler(NULL, NULL);
}

/* ------------------------------------------------------- key rotation */

/* Replaces a key file as an operator should: written beside it, renamed over it. */
static void put_key(const char *path, const char *text)
{
	char tmp[200];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	write_file(tmp, text, 0600);
	REQUIRE(rename(tmp, path) == 0);
}

/* Whether `from` passes the handshake to `to`'s RPC port (a connection of
 * its own each time), after the engines looked at their files again. */
static int probe(te_engine *from, te_engine *to)
{
	return te_segment_probe(from, te_engine_name(to), 2000);
}

static void files_seen(void)
{
	usleep(1100 * 1000); /* the files are looked at once a second at most */
}

/* Once the engines looked at their files: a probe from `from` to `to` ends
 * `want`, the log holding `says`. */
static void probe_says(te_engine *from, te_engine *to, int want, const char *says)
{
	files_seen();
	CHECK_EQ(probe(from, to), want);
	CHECK(cap_has(says));
}

/* Once the engines looked at their files: each reaches the other. */
static bool connected(te_engine *a, te_engine *b)
{
	files_seen();
	int ab = probe(a, b), ba = probe(b, a);
	if (ab != 0 || ba != 0)
		fprintf(stderr, "  a to b: %s, b to a: %s\n", te_strerror(ab), te_strerror(ba));
	return ab == 0 && ba == 0;
}

/* Writes `text` into `path` (created with `mode`), or removes it (NULL). */
static void set_key(const char *path, const char *text)
{
	if (text != NULL)
		put_key(path, text);
	else
		REQUIRE(unlink(path) == 0);
}

/* The key changes while the engines run, in the three steps the docs give:
 * the new key into every host's .next file and the old one into its .prev
 * file; then the new key into every key file; then the .next and .prev files
 * go. Each file is changed alone and the engines look at it before the next
 * change, so every state a host passes through meets every state of the
 * other host one step before or after it: each reaches the other throughout.
 * In the end only the new key opens the cluster. A file that does not read
 * as a key leaves the key the engine had. */
static void test_rotation(void)
{
	char ka[160], kb[160], ka_next[170], kb_next[170], ka_prev[170], kb_prev[170];
	const char *K1 = "0123456789abcdef-rotate-old\n", *K2 = "0123456789abcdef-rotate-new\n";
	snprintf(ka, sizeof ka, "%s/rot-a.key", dir);
	snprintf(kb, sizeof kb, "%s/rot-b.key", dir);
	snprintf(ka_next, sizeof ka_next, "%s.next", ka);
	snprintf(kb_next, sizeof kb_next, "%s.next", kb);
	snprintf(ka_prev, sizeof ka_prev, "%s.prev", ka);
	snprintf(kb_prev, sizeof kb_prev, "%s.prev", kb);
	put_key(ka, K1);
	put_key(kb, K1);
	/* A .next or .prev file that is no key fails the start, as the key file does. */
	put_key(ka_next, "short\n");
	cap_start();
	CHECK(engine_with_key(ka) == NULL);
	CHECK(cap_has("rot-a.key.next is 5 bytes long"));
	REQUIRE(unlink(ka_next) == 0);
	put_key(ka_prev, "short\n");
	CHECK(engine_with_key(ka) == NULL);
	CHECK(cap_has("rot-a.key.prev is 5 bytes long"));
	te_set_log_handler(NULL, NULL);
	REQUIRE(unlink(ka_prev) == 0);
	te_engine *a = engine_with_key(ka), *b = engine_with_key(kb);
	REQUIRE(a && b);
	CHECK_EQ(probe(a, b), 0);
	CHECK_EQ(probe(b, a), 0);

	/* b goes one change ahead of a, through all three steps: b's change,
	 * then a's catching up with b's previous one, and so on. */
	struct {
		const char *file, *text, *log;
	} change[] = {
		/* step 1: the new key accepted, the old one still proven */
		{ kb_next, K2, "rot-b.key.next: its key is accepted too from now on" },
		{ ka_next, K2, NULL },
		{ kb_prev, K1, "rot-b.key.prev: its key is accepted too from now on" },
		{ ka_prev, K1, NULL },
		/* step 2: the new key proven, the old one still accepted */
		{ kb, K2, "rot-b.key changed: this engine proves its new key from now on" },
		{ ka, K2, NULL },
		/* step 3: the old key no longer accepted */
		{ kb_next, NULL, "rot-b.key.next is gone: its key is no longer accepted" },
		{ ka_next, NULL, NULL },
		{ kb_prev, NULL, "rot-b.key.prev is gone" },
		{ ka_prev, NULL, NULL },
	};
	size_t n_change = sizeof change / sizeof change[0];
	cap_start();
	te_set_log_level(TE_LOG_INFO); /* the changes are logged at info */
	for (size_t i = 0; i < n_change; i++) {
		set_key(change[i].file, change[i].text);
		/* After each of b's changes, a one behind it (and at the end). */
		if (i % 2 == 0 || i == n_change - 1) {
			fprintf(stderr, "  after change %zu (%s %s)\n", i, change[i].text ? "wrote" : "removed",
				strrchr(change[i].file, '/') + 1);
			CHECK(connected(a, b));
		}
	}
	for (size_t i = 0; i < n_change; i++)
		if (change[i].log)
			CHECK(cap_has(change[i].log));
	char kold[160];
	snprintf(kold, sizeof kold, "%s/rot-old.key", dir);
	put_key(kold, K1);
	te_engine *old = engine_with_key(kold);
	REQUIRE(old != NULL);
	CHECK_EQ(probe(old, a), TE_ERR_AUTH);
	CHECK_EQ(probe(a, old), TE_ERR_AUTH);

	/* Out of order: a proves a key b does not hold (no step 1): refused
	 * both ways until a goes back. */
	put_key(ka, "0123456789abcdef-rotate-third\n");
	files_seen();
	CHECK_EQ(probe(a, b), TE_ERR_AUTH);
	CHECK_EQ(probe(b, a), TE_ERR_AUTH);
	put_key(ka, K2);

	/* A file that is no key (cut short) leaves the one the engine had. */
	put_key(kb, "short\n");
	probe_says(a, b, 0, "holds no usable key: the key read before stays");
	CHECK(!cap_has_quiet("rotate-new")); /* never the secret */
	te_set_log_level(TE_LOG_WARN);
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(old);
	te_engine_destroy(a);
	te_engine_destroy(b);
}

/* ------------------------------------------- who may write a key file */

/* Key files anyone but this user and root could have written or put in
 * place are refused (util/teu-secret-file.h): at the start, failing the engine,
 * and when looked at again, leaving the keys read before. Whether a key is
 * accepted shows from this side as a client: a peer proves its own key,
 * and passes only when this engine holds it. "Another user" is nobody
 * (uid 65534), which needs root for chown; without root those cases are
 * skipped, saying so. */
#define NOBODY 65534
static const char *K_OWN = "0123456789abcdef-own-key\n", *K_EVIL = "0123456789abcdef-planted-key\n";

static void mkdir_mode(const char *path, mode_t mode)
{
	REQUIRE(mkdir(path, 0700) == 0);
	REQUIRE(chmod(path, mode) == 0);
}

/* Creating an engine with `key` fails, and the log says `why1` and `why2`. */
static void start_refused(const char *key, const char *why1, const char *why2)
{
	cap_start();
	te_engine *e = engine_with_key(key);
	CHECK(e == NULL);
	CHECK(cap_has("refused the key file"));
	CHECK(cap_has(key));
	CHECK(cap_has(why1));
	if (why2)
		CHECK(cap_has(why2));
	CHECK(!cap_has_quiet("own-key")); /* never the secret */
	te_engine_destroy(e);
	te_set_log_handler(NULL, NULL);
}

static void start_accepted(const char *key)
{
	cap_start();
	te_engine *e = engine_with_key(key);
	CHECK(e != NULL);
	CHECK(!cap_has_quiet("refused"));
	te_engine_destroy(e);
	te_set_log_handler(NULL, NULL);
}

static void test_key_file_modes(void)
{
	char p[200];

	/* The file: group- or other-writable. */
	snprintf(p, sizeof p, "%s/group-w.key", dir);
	write_file(p, K_OWN, 0620);
	start_refused(p, "mode 0620", "can be written by its group");
	snprintf(p, sizeof p, "%s/other-w.key", dir);
	write_file(p, K_OWN, 0602);
	start_refused(p, "mode 0602", "can be written by others");

	/* Its directory: writable by others and not sticky, even for a file of our own. */
	char w[160];
	snprintf(w, sizeof w, "%s/open-dir", dir);
	mkdir_mode(w, 0777);
	snprintf(p, sizeof p, "%s/k.key", w);
	write_file(p, K_OWN, 0600);
	start_refused(p, "mode 0777", "is not sticky");
	REQUIRE(chmod(w, 0770) == 0);
	start_refused(p, "can be written by its group and is not sticky", NULL);

	/* Accepted: a 0600 file of our own in a sticky directory others can write. */
	char t[160];
	snprintf(t, sizeof t, "%s/sticky", dir);
	mkdir_mode(t, 01777);
	snprintf(p, sizeof p, "%s/k.key", t);
	write_file(p, K_OWN, 0600);
	start_accepted(p);

	/* A symlink in a directory only we write, as Kubernetes mounts secrets:
	 * followed, and its target judged again. */
	char l[200], real[200];
	snprintf(real, sizeof real, "%s/real.key", dir);
	write_file(real, K_OWN, 0600);
	snprintf(l, sizeof l, "%s/link.key", dir);
	REQUIRE(symlink("real.key", l) == 0);
	start_accepted(l);
	snprintf(l, sizeof l, "%s/link-open.key", dir);
	snprintf(p, sizeof p, "%s/k.key", w); /* in the 0770 directory */
	REQUIRE(symlink(p, l) == 0);
	start_refused(l, "open-dir (uid", "is not sticky");
}

/* A .next file planted into the key file's directory after the start: in
 * a directory others can write without the sticky bit, and (as another
 * user) in a sticky one, as a file or a symlink. The engine keeps the keys
 * it had and says why it refused. */
static void test_key_file_planted(void)
{
	char ev[160], w[160], wk[200], wn[210];
	snprintf(ev, sizeof ev, "%s/evil.key", dir);
	write_file(ev, K_EVIL, 0600);
	te_engine *evil = engine_with_key(ev);
	REQUIRE(evil != NULL);

	/* A directory that became writable by all, without the sticky bit. */
	snprintf(w, sizeof w, "%s/later-open", dir);
	mkdir_mode(w, 0700);
	snprintf(wk, sizeof wk, "%s/k.key", w);
	write_file(wk, K_OWN, 0600);
	te_engine *a = engine_with_key(wk);
	REQUIRE(a != NULL);
	CHECK_EQ(probe(a, evil), TE_ERR_AUTH);
	REQUIRE(chmod(w, 0777) == 0);
	snprintf(wn, sizeof wn, "%s.next", wk);
	write_file(wn, K_EVIL, 0600);
	cap_start();
	probe_says(a, evil, TE_ERR_AUTH, "refused the key file");
	CHECK(cap_has("later-open/k.key.next"));
	CHECK(cap_has("(uid 0, mode 0777) can be written by others and is not sticky") ||
	      geteuid() != 0);
	CHECK(cap_has("the key read before stays"));
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(a);

	if (geteuid() != 0) {
		fprintf(stderr, "  skipped: files of another user need root (chown to uid %d)\n", NOBODY);
		te_engine_destroy(evil);
		return;
	}
	/* A sticky directory: our key file taken, another user's .next not. */
	char s[160], sk[200], sn[210];
	snprintf(s, sizeof s, "%s/planted-sticky", dir);
	mkdir_mode(s, 01777);
	snprintf(sk, sizeof sk, "%s/k.key", s);
	write_file(sk, K_OWN, 0600);
	a = engine_with_key(sk);
	REQUIRE(a != NULL);
	snprintf(sn, sizeof sn, "%s.next", sk);
	write_file(sn, K_EVIL, 0600);
	REQUIRE(chown(sn, NOBODY, NOBODY) == 0);
	cap_start();
	probe_says(a, evil, TE_ERR_AUTH,
		   "planted-sticky/k.key.next is owned by uid 65534 (mode 0600), not by this process's uid 0 or root");

	/* Another user's symlink there, to a file of root's they can read
	 * (0644), so they know the key it holds. */
	char pub[160];
	snprintf(pub, sizeof pub, "%s/public.key", dir);
	write_file(pub, K_EVIL, 0644);
	REQUIRE(unlink(sn) == 0);
	REQUIRE(symlink(pub, sn) == 0);
	REQUIRE(lchown(sn, NOBODY, NOBODY) == 0);
	probe_says(a, evil, TE_ERR_AUTH, "planted-sticky/k.key.next is a symlink owned by uid 65534 in");
	/* Another user's file at the start fails it. */
	char nk[160];
	snprintf(nk, sizeof nk, "%s/nobody.key", dir);
	write_file(nk, K_OWN, 0600);
	REQUIRE(chown(nk, NOBODY, NOBODY) == 0);
	start_refused(nk, "is owned by uid 65534 (mode 0600), not by this process's uid 0 or root", NULL);
	/* A file of our own in a directory of another user's: they could swap it. */
	char nd[160], ndk[200];
	snprintf(nd, sizeof nd, "%s/nobody-dir", dir);
	mkdir_mode(nd, 0755);
	snprintf(ndk, sizeof ndk, "%s/k.key", nd);
	write_file(ndk, K_OWN, 0600);
	REQUIRE(chown(nd, NOBODY, NOBODY) == 0);
	start_refused(ndk, "nobody-dir is owned by uid 65534 (mode 0755)", NULL);
	/* Another user's hard link, in the sticky directory, to a file of
	 * root's they can read: its owner is root, but not its name. */
	char hl[200];
	snprintf(hl, sizeof hl, "%s/linked.key", s);
	REQUIRE(link(pub, hl) == 0);
	start_refused(hl, "linked.key has 2 links in", NULL);

	/* The same symlink of our own (root's) is followed: the key in the
	 * file it names is accepted. */
	REQUIRE(lchown(sn, 0, 0) == 0);
	cap_start();
	te_set_log_level(TE_LOG_INFO);
	probe_says(a, evil, 0, "k.key.next: its key is accepted too from now on");
	te_set_log_level(TE_LOG_WARN);
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(a);
	te_engine_destroy(evil);
}

/* Running as another user (nobody): a file of root's in a directory of
 * root's is taken; the owner check is not "the same uid" alone. Root only. */
static void test_key_file_root_owned(void)
{
	if (geteuid() != 0) {
		fprintf(stderr, "  skipped: running as another user needs root\n");
		return;
	}
	char r[160], rk[200];
	snprintf(r, sizeof r, "%s/root-owned", dir);
	mkdir_mode(r, 0755);
	snprintf(rk, sizeof rk, "%s/k.key", r);
	write_file(rk, K_OWN, 0644); /* nobody must read it */
	REQUIRE(chmod(dir, 0711) == 0);
	REQUIRE(seteuid(NOBODY) == 0);
	start_accepted(rk);
	REQUIRE(seteuid(0) == 0);
	REQUIRE(chmod(dir, 0700) == 0);
}

/* --------------------------------------------- the target with the key */

static target tk;

static void test_right_key(void)
{
	te_engine *e = engine_with_key(key_a);
	REQUIRE(e != NULL);
	CHECK(transfers_work(e, &tk, 1));
	te_engine_destroy(e);
}

static void test_wrong_and_no_key(void)
{
	te_engine *wrong = engine_with_key(key_b), *none = engine_with_key(NULL);
	REQUIRE(wrong && none);
	cap_start();
	open_refused(wrong, tk.name, "wrong key");
	CHECK(cap_has("could not prove the cluster key"));
	open_refused(none, tk.name, "no key");
	CHECK(cap_has("TE_AUTH_KEY_FILE"));
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(wrong);
	te_engine_destroy(none);
}

/* A plain Metadata frame gets the "authentication required" reply, never
 * the descriptor. */
static void test_plain_frame(void)
{
	char *r = rpc_exchange(tk.rpc_port, 1, "{}");
	CHECK(r != NULL && strstr(r, "auth_required") != NULL);
	CHECK(r == NULL || strstr(r, "buffers") == NULL);
	free(r);
}

/* ----------------------------------------------------------- replay */

/* Forwards one connection to the target's RPC port and records what the
 * client sent. */
typedef struct proxy {
	int lfd, port, to_port;
	unsigned char rec[1 << 16];
	size_t nrec;
} proxy;

static void *proxy_main(void *arg)
{
	proxy *p = arg;
	int c = accept(p->lfd, NULL, NULL);
	if (c < 0)
		return NULL;
	int s = connect_port(p->to_port);
	if (s < 0) {
		close(c);
		return NULL;
	}
	char buf[8192];
	for (;;) {
		struct pollfd pf[2] = { { .fd = c, .events = POLLIN }, { .fd = s, .events = POLLIN } };
		if (poll(pf, 2, 10000) <= 0)
			break;
		if (pf[0].revents) {
			ssize_t r = recv(c, buf, sizeof buf, 0);
			if (r <= 0)
				break;
			if (p->nrec + (size_t)r <= sizeof p->rec) {
				memcpy(p->rec + p->nrec, buf, (size_t)r);
				p->nrec += (size_t)r;
			}
			if (!send_all(s, buf, (size_t)r))
				break;
		}
		if (pf[1].revents) {
			ssize_t r = recv(s, buf, sizeof buf, 0);
			if (r <= 0)
				break;
			if (!send_all(c, buf, (size_t)r))
				break;
		}
	}
	close(c);
	close(s);
	return NULL;
}

static void test_replay(void)
{
	static proxy p;
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof a;
	pthread_t th;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	p.lfd = socket(AF_INET, SOCK_STREAM, 0);
	REQUIRE(p.lfd >= 0 && bind(p.lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(p.lfd, 4) == 0);
	REQUIRE(getsockname(p.lfd, (struct sockaddr *)&a, &al) == 0);
	p.port = ntohs(a.sin_port);
	p.to_port = tk.rpc_port;
	REQUIRE(pthread_create(&th, NULL, proxy_main, &p) == 0);

	/* A real, successful exchange through the proxy (a Probe). */
	te_engine *e = engine_with_key(key_a);
	REQUIRE(e != NULL);
	char via[64];
	snprintf(via, sizeof via, "127.0.0.1:%d", p.port);
	CHECK_EQ(te_segment_probe(e, via, 5000), 0);
	pthread_join(th, NULL);
	close(p.lfd);
	te_engine_destroy(e);
	fprintf(stderr, "  recorded %zu bytes of a client's exchange\n", p.nrec);
	CHECK(p.nrec > 96);

	/* The same bytes on a new connection: the target's fresh nonce makes
	 * the recorded proof worthless. */
	int fd = tcp_connect_port(tk.rpc_port);
	REQUIRE(fd >= 0);
	CHECK(send_all(fd, p.rec, p.nrec));
	unsigned char in[4096];
	size_t got = 0;
	recv_exact(fd, in, sizeof in, 5000, &got);
	close(fd);
	fprintf(stderr, "  replay answered with %zu bytes\n", got);
	/* A challenge (80 bytes) and a refusal (16 bytes, status not 0); no frame. */
	CHECK(got <= 96);
	CHECK(got < 96 || in[80 + 10] != 0);
	in[got < sizeof in ? got : sizeof in - 1] = 0;
	CHECK(memmem(in, got, "success", 7) == NULL);
}

/* A valid data request straight to the data port, no handshake: the
 * connection closes and nothing comes back. */
static void test_raw_data_request(void)
{
	int fd = tcp_connect_port(tk.data_port);
	REQUIRE(fd >= 0);
	unsigned char h[W_HDR];
	put_hdr(h, 64, tk.addr, 0x80 | TE_OP_READ);
	CHECK(send_all(fd, h, sizeof h));
	unsigned char in[128];
	size_t got = 0;
	ssize_t r = recv_exact(fd, in, sizeof in, 5000, &got);
	fprintf(stderr, "  raw data request: %zd, %zu bytes back\n", r, got);
	CHECK_EQ(got, 0);
	CHECK(r != -1 || errno == ECONNRESET);
	close(fd);
}

static void test_target_log_and_still_serving(void)
{
	/* The refusals were logged naming the peer's address... */
	CHECK(log_has(target_log, "auth: refused"));
	CHECK(log_has(target_log, "127.0.0.1"));
	/* ...and the right-keyed peer is still served. */
	te_engine *e = engine_with_key(key_a);
	REQUIRE(e != NULL);
	CHECK(transfers_work(e, &tk, 9));
	te_engine_destroy(e);
}

/* A keyed initiator and a key-less target. */
static void test_keyless_target(void)
{
	target t;
	char log[160];
	snprintf(log, sizeof log, "%s/plain-target.log", dir);
	target_start(&t, NULL, log);
	te_engine *e = engine_with_key(key_a);
	REQUIRE(e != NULL);
	cap_start();
	open_refused(e, t.name, "keyed initiator, key-less target");
	CHECK(cap_has("no key"));
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(e);
	/* Without a key on either side nothing changed. */
	e = engine_with_key(NULL);
	REQUIRE(e != NULL);
	CHECK(transfers_work(e, &t, 3));
	te_engine_destroy(e);
	child_stop(&t.c, 0);
}

/* ------------------------------------------------- per-address limit */

/* TE_TCP_MAX_PER_PEER=2: a third data connection from the same address is
 * closed at once (and logged); the two open ones are not touched; once one
 * closes, the address may connect again. */
static void test_max_per_peer(void)
{
	te_option o = { "TE_TCP_MAX_PER_PEER", "2" };
	te_engine *e = tcp_engine(&o, 1);
	REQUIRE(e != NULL);
	char *d = rpc_exchange(te_engine_rpc_port(e), 1, "{}");
	REQUIRE(d != NULL);
	int port = (int)json_int(d, "tcp_data_port");
	free(d);
	REQUIRE(port > 0);
	cap_start();
	int a = tcp_connect_port(port), b = tcp_connect_port(port), c = tcp_connect_port(port);
	REQUIRE(a >= 0 && b >= 0 && c >= 0);
	CHECK(closed_quietly(c, 3000));
	CHECK(silent_for(a, 200) && silent_for(b, 200));
	CHECK(cap_has("TE_TCP_MAX_PER_PEER"));
	close(c);
	close(a);
	usleep(200000); /* the target sees the close */
	int again = tcp_connect_port(port);
	REQUIRE(again >= 0);
	CHECK(silent_for(again, 300)); /* accepted: open, waiting for a request */
	close(again);
	close(b);
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(e);
}

/* ------------------------------------------------------------ a store */

static void test_store(void)
{
	if (mds_bin == NULL || access(mds_bin, X_OK) != 0) {
		fprintf(stderr, "  (no te-metadata-server: the store case is skipped)\n");
		return;
	}
	int port = te_test_free_port();
	REQUIRE(port > 0);
	char listen_at[64], conn[128];
	snprintf(listen_at, sizeof listen_at, "127.0.0.1:%d", port);
	snprintf(conn, sizeof conn, "http://127.0.0.1:%d/metadata", port);
	char *av[] = { (char *)mds_bin, "--listen", listen_at, NULL };
	child srv;
	REQUIRE(child_start(&srv, av, NULL));
	int fd = -1;
	for (int i = 0; i < 200 && fd < 0; i++) {
		fd = connect_port(port);
		if (fd < 0)
			usleep(25000);
	}
	REQUIRE(fd >= 0);
	close(fd);

	te_option ok[3] = { { "transports", "tcp" }, { "ip_or_host_name", "127.0.0.1" }, { "auth_key_file", key_a } };
	te_engine *k = NULL, *n = NULL, *k2 = NULL;
	REQUIRE(te_engine_create(conn, "auth-keyed", ok, 3, &k) == 0);
	REQUIRE(te_engine_create(conn, "auth-plain", ok, 2, &n) == 0);
	REQUIRE(te_engine_create(conn, "auth-keyed2", ok, 3, &k2) == 0);
	unsigned char *buf = map_buf(1 << 20);
	REQUIRE(te_register_memory(k, buf, 1 << 20, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	cap_start();
	/* No key: the descriptor says "auth", so it fails before connecting. */
	open_refused(n, "auth-keyed", "store, key-less initiator");
	CHECK(cap_has("requires peer authentication"));
	/* A key: a key-less peer is refused the same way. */
	open_refused(k, "auth-plain", "store, keyed initiator, key-less target");
	CHECK(cap_has("does not authenticate its peers"));
	te_set_log_handler(NULL, NULL);
	/* Both keyed: it works through the store too. */
	te_segment_id seg = te_segment_open(k2, "auth-keyed");
	CHECK(seg > 0);
	if (seg > 0) {
		unsigned char *mine = map_buf(4096);
		REQUIRE(te_register_memory(k2, mine, 4096, "cpu:0", 0) == 0);
		memset(buf, 0x5a, 4096);
		CHECK_EQ(run_one(k2, TE_OP_READ, seg, mine, (uint64_t)(uintptr_t)buf, 4096, NULL), TE_TASK_COMPLETED);
		CHECK(mine[0] == 0x5a && mine[4095] == 0x5a);
		te_segment_close(k2, seg);
	}
	te_engine_destroy(k2);
	te_engine_destroy(n);
	te_engine_destroy(k);
	munmap(buf, 1 << 20);
	child_stop(&srv, SIGTERM);
}

int main(int argc, char **argv)
{
	REQUIRE(argc > 1);
	peer_bin = argv[1];
	mds_bin = argc > 2 ? argv[2] : NULL;
	signal(SIGPIPE, SIG_IGN);
	REQUIRE(mkdtemp(dir) != NULL);
	snprintf(key_a, sizeof key_a, "%s/a.key", dir);
	snprintf(key_b, sizeof key_b, "%s/b.key", dir);
	snprintf(key_short, sizeof key_short, "%s/short.key", dir);
	snprintf(key_open, sizeof key_open, "%s/open.key", dir);
	snprintf(target_log, sizeof target_log, "%s/target.log", dir);
	write_file(key_a, "0123456789abcdef-cluster-a\n", 0600);
	write_file(key_b, "0123456789abcdef-cluster-b\n", 0600);
	write_file(key_short, "tooshort\n", 0600);
	write_file(key_open, "0123456789abcdef-cluster-a", 0644);

	TEST_RUN(test_key_files);
	TEST_RUN(test_rotation);
	TEST_RUN(test_key_file_modes);
	TEST_RUN(test_key_file_planted);
	TEST_RUN(test_key_file_root_owned);
	TEST_RUN(test_max_per_peer);
	target_start(&tk, key_a, target_log);
	TEST_RUN(test_right_key);
	TEST_RUN(test_wrong_and_no_key);
	TEST_RUN(test_plain_frame);
	TEST_RUN(test_replay);
	TEST_RUN(test_raw_data_request);
	TEST_RUN(test_target_log_and_still_serving);
	child_stop(&tk.c, 0);
	TEST_RUN(test_keyless_target);
	TEST_RUN(test_store);

	char cmd[200];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (check_failures == 0 && system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	return check_done();
}
