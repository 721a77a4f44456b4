/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libteu's host:port, redaction, device-export, PCI, JSON-text, list and
 * error-line helpers (util/teu-hostport.h, util/teu-redact.h,
 * util/teu-devmem.h, util/teu-pci.h, util/teu-json.h, util/teu-dlist.h,
 * util/teu-fmt.h),
 * which the control plane, the TCP transport, the HTTP servers, the
 * metadata plugins, both device plugins and the benchmarks take their
 * parsing, names, logged URLs, range checks, device entries, descriptors'
 * text and error lines from.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib.h>

#include "teu-devmem.h"
#include "teu-dlist.h"
#include "teu-search.h"
#include "teu-fmt.h"
#include "teu-hostport.h"
#include "teu-json.h"
#include "teu-pci.h"
#include "teu-redact.h"
#include "../common/check.h"
#include "../common/host-log.h"

/* split() of `s`: its return, and the host and port when it took it. */
static int split(const char *s, const char *host, int port)
{
	char h[TEU_HOST_MAX];
	int p = -2;
	int rc = teu_hostport_split(s, h, sizeof h, &p);

	if (rc == 0 && (strcmp(h, host) != 0 || p != port)) {
		fprintf(stderr, "  '%s': host '%s' port %d, expected '%s' %d\n", s, h, p, host, port);
		return 1;
	}
	return rc;
}

static void test_split(void)
{
	CHECK_EQ(split("10.0.0.1:80", "10.0.0.1", 80), 0);
	CHECK_EQ(split("node-1.example", "node-1.example", -1), 0);
	CHECK_EQ(split("[fe80::1]:65535", "fe80::1", 65535), 0);
	CHECK_EQ(split("[::1]", "::1", -1), 0);
	CHECK_EQ(split(":0", "", 0), 0);
	CHECK_EQ(split("h:00080", "h", 80), 0);
	CHECK_EQ(split("", "", -1), 0);

	CHECK_EQ(split("fe80::1", "", 0), -EINVAL);     /* where would its port start? */
	CHECK_EQ(split("fe80::1:80", "", 0), -EINVAL);
	CHECK_EQ(split("[fe80::1", "", 0), -EINVAL);    /* unclosed */
	CHECK_EQ(split("[::1]80", "", 0), -EINVAL);     /* no ':' after ']' */
	CHECK_EQ(split("[::1]:", "", 0), -EINVAL);
	CHECK_EQ(split("h:", "", 0), -EINVAL);
	CHECK_EQ(split("h:65536", "", 0), -EINVAL);
	CHECK_EQ(split("h:99999999999999999999", "", 0), -EINVAL); /* no wrap-around */
	CHECK_EQ(split("h:+80", "", 0), -EINVAL);
	CHECK_EQ(split("h: 80", "", 0), -EINVAL);
	CHECK_EQ(split("h:80 ", "", 0), -EINVAL);
	CHECK_EQ(split("h:0x50", "", 0), -EINVAL);

	/* The host must fit, its NUL included. */
	char small[4];
	int p;
	CHECK_EQ(teu_hostport_split("abc:1", small, sizeof small, &p), 0);
	CHECK(strcmp(small, "abc") == 0 && p == 1);
	CHECK_EQ(teu_hostport_split("abcd:1", small, sizeof small, &p), -ENAMETOOLONG);
	CHECK_EQ(teu_hostport_split("[abcd]:1", small, sizeof small, &p), -ENAMETOOLONG);
}

static void test_names(void)
{
	struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons(15123) };
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(80) };
	struct sockaddr_in6 m6 = { .sin6_family = AF_INET6, .sin6_port = htons(7) };
	struct sockaddr_un_like {
		sa_family_t family;
		char path[32];
	} other = { AF_UNIX, "x" };
	char buf[TEU_SOCKADDR_NAME_MAX], host[TEU_SOCKADDR_NAME_MAX];

	inet_pton(AF_INET, "10.1.2.3", &a4.sin_addr);
	teu_sockaddr_name((struct sockaddr *)&a4, buf, sizeof buf);
	CHECK(strcmp(buf, "10.1.2.3:15123") == 0);
	teu_hostport_host(buf, host, sizeof host);
	CHECK(strcmp(host, "10.1.2.3") == 0);

	inet_pton(AF_INET6, "fe80::1", &a6.sin6_addr);
	teu_sockaddr_name((struct sockaddr *)&a6, buf, sizeof buf);
	CHECK(strcmp(buf, "[fe80::1]:80") == 0);
	teu_hostport_host(buf, host, sizeof host);
	CHECK(strcmp(host, "[fe80::1]") == 0);

	/* a dual-stack socket's IPv4 peer reads as IPv4 */
	inet_pton(AF_INET6, "::ffff:192.0.2.9", &m6.sin6_addr);
	teu_sockaddr_name((struct sockaddr *)&m6, buf, sizeof buf);
	CHECK(strcmp(buf, "192.0.2.9:7") == 0);

	/* the longest name fits the room the header promises */
	inet_pton(AF_INET6, "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", &a6.sin6_addr);
	a6.sin6_port = htons(65535);
	teu_sockaddr_name((struct sockaddr *)&a6, buf, sizeof buf);
	CHECK(buf[0] == '[' && strcmp(buf + strlen(buf) - 7, "]:65535") == 0);

	teu_sockaddr_name((struct sockaddr *)&other, buf, sizeof buf);
	CHECK(strcmp(buf, "?") == 0);
	teu_hostport_host("noport", host, sizeof host);
	CHECK(strcmp(host, "noport") == 0);
	teu_hostport_host("[::1]:80", host, 4); /* cut to the room given */
	CHECK(strcmp(host, "[::") == 0);
}

/* Whether teu_redact(in) is `want`. */
static bool redacts(const char *in, const char *want)
{
	char *got = teu_redact(in);
	bool ok = strcmp(got, want) == 0;

	if (!ok)
		fprintf(stderr, "  '%s' -> '%s', expected '%s'\n", in ? in : "(NULL)", got, want);
	g_free(got);
	return ok;
}

static void test_redact(void)
{
	CHECK(redacts("etcd://user:pw@10.0.0.1:2379/v3", "etcd://user:***@10.0.0.1:2379/v3"));
	CHECK(redacts("redis://u:p@ss@h:6379", "redis://u:***@h:6379")); /* a raw '@' in it */
	CHECK(redacts("u:pw@h:1", "u:***@h:1"));                          /* no scheme */
	CHECK(redacts("http://user@h/", "http://user@h/"));               /* a name alone */
	CHECK(redacts("http://h:80/a:b@c", "http://h:80/a:b@c"));         /* '@' past the host */
	CHECK(redacts("https://h:443?x=a:b@c", "https://h:443?x=a:b@c"));
	CHECK(redacts(NULL, "(null)"));
}

static void test_range(void)
{
	uint64_t off = 7;

	CHECK(teu_range_in(0x1000, 0x100, 0x1000, 0x100, &off) && off == 0);
	CHECK(teu_range_in(0x10f0, 0x10, 0x1000, 0x100, &off) && off == 0xf0);
	CHECK(teu_range_in(0x1100, 0, 0x1000, 0x100, &off) && off == 0x100);
	off = 7;
	CHECK(!teu_range_in(0x10f0, 0x11, 0x1000, 0x100, &off)); /* one past the end */
	CHECK(!teu_range_in(0xfff, 0x10, 0x1000, 0x100, &off));  /* starts before it */
	/* a length that wraps addr + len round to inside the allocation */
	CHECK(!teu_range_in(0x1010, SIZE_MAX - 0x8, 0x1000, 0x100, &off));
	CHECK(!teu_range_in(UINTPTR_MAX - 0xf, 0x20, UINTPTR_MAX - 0xff, 0x100, &off));
	CHECK(off == 7); /* untouched when refused */
}

static uint64_t start_of(const void *arr, size_t i)
{
	return ((const uint64_t *)arr)[i];
}

/* teu_count_at_or_below(): the count of sorted starts at or below a key,
 * at each edge; the last of those is the range that may hold the key. */
static void test_search(void)
{
	static const uint64_t starts[] = { 0x1000, 0x2000, 0x2000, 0x8000 };
	const size_t n = sizeof starts / sizeof starts[0];

	CHECK_EQ(teu_count_at_or_below(starts, 0, start_of, 0x5000), 0);
	CHECK_EQ(teu_count_at_or_below(starts, n, start_of, 0), 0);
	CHECK_EQ(teu_count_at_or_below(starts, n, start_of, 0xfff), 0);
	CHECK_EQ(teu_count_at_or_below(starts, n, start_of, 0x1000), 1);
	CHECK_EQ(teu_count_at_or_below(starts, n, start_of, 0x1fff), 1);
	CHECK_EQ(teu_count_at_or_below(starts, n, start_of, 0x2000), 3); /* both equal starts */
	CHECK_EQ(teu_count_at_or_below(starts, n, start_of, 0x7fff), 3);
	CHECK_EQ(teu_count_at_or_below(starts, n, start_of, UINT64_MAX), 4);
	CHECK(teu_span_within(0x2000, 0x100, 0x2000, 0x100));
	CHECK(!teu_span_within(0x2001, 0x100, 0x2000, 0x100));
	CHECK(!teu_span_within(0x1fff, 0x1, 0x2000, 0x100));
	CHECK(!teu_span_within(0x2010, UINT64_MAX - 0x8, 0x2000, 0x100)); /* a length that wraps */
}

/* A node on two lists at once, as the transports' nodes are. */
typedef struct dnode {
	int id;
	struct dnode *prev, *next;   /* on a list with a tail */
	struct dnode *aprev, *anext; /* on a list without */
} dnode;

/* The ids from head to tail, checking each back link on the way. */
static void dlist_ids(const dnode *head, char *out)
{
	const dnode *back = NULL;
	for (const dnode *n = head; n != NULL; back = n, n = n->next) {
		CHECK(n->prev == back);
		*out++ = (char)('0' + n->id);
	}
	*out = '\0';
}

/* teu-dlist.h: pushes and unlinks at the head, the middle and the tail
 * keep both ends and every link in step. */
static void test_dlist(void)
{
	dnode n[4] = { { .id = 0 }, { .id = 1 }, { .id = 2 }, { .id = 3 } };
	dnode *head = NULL, *tail = NULL, *ahead = NULL;
	char ids[8];

	for (int i = 0; i < 4; i++) {
		TEU_DLIST_PUSH_TAIL(head, tail, &n[i], prev, next);
		TEU_DLIST_PUSH(ahead, &n[i], aprev, anext);
	}
	dlist_ids(head, ids);
	CHECK(strcmp(ids, "3210") == 0);
	CHECK(tail == &n[0]);
	CHECK(ahead == &n[3] && n[3].anext == &n[2] && n[2].aprev == &n[3]);

	dnode *x = &n[2]; /* the middle */
	TEU_DLIST_REMOVE_TAIL(head, tail, x, prev, next);
	dlist_ids(head, ids);
	CHECK(strcmp(ids, "310") == 0);
	CHECK(n[2].prev == NULL && n[2].next == NULL);
	x = &n[0]; /* the tail */
	TEU_DLIST_REMOVE_TAIL(head, tail, x, prev, next);
	CHECK(tail == &n[1]);
	x = &n[3]; /* the head */
	TEU_DLIST_REMOVE_TAIL(head, tail, x, prev, next);
	dlist_ids(head, ids);
	CHECK(strcmp(ids, "1") == 0);
	CHECK(head == &n[1] && tail == &n[1]);
	x = &n[1]; /* the last one */
	TEU_DLIST_REMOVE_TAIL(head, tail, x, prev, next);
	CHECK(head == NULL && tail == NULL);

	/* The other list was not touched; without a tail, from its head. */
	x = &n[3];
	TEU_DLIST_REMOVE(ahead, x, aprev, anext);
	CHECK(ahead == &n[2] && n[2].aprev == NULL);
	x = &n[1];
	TEU_DLIST_REMOVE(ahead, x, aprev, anext);
	CHECK(n[2].anext == &n[0] && n[0].aprev == &n[2]);
}

static void test_range_check(void)
{
	te_host h = { .log = host_log };
	void *p = (void *)(uintptr_t)0x10f0;

	CHECK_EQ(teu_range_check(&h, p, 0x10, 0x1000, 0x100), 0);
	CHECK_EQ(host_log_level, -1); /* nothing said of a range that fits */
	CHECK_EQ(teu_range_check(&h, p, 0x11, 0x1000, 0x100), -EINVAL);
	CHECK_EQ(host_log_level, TE_LOG_ERROR);
	CHECK(strstr(host_log_last, "+17 runs past its device allocation (256 bytes at 0x1000)") != NULL);
	/* a length that wraps addr + len round to inside the allocation */
	CHECK_EQ(teu_range_check(&h, p, SIZE_MAX - 0x8, 0x1000, 0x100), -EINVAL);
	CHECK_EQ(teu_range_check(&h, (void *)(uintptr_t)0xfff, 0x10, 0x1000, 0x100), -EINVAL);
}

static void test_pci_info(void)
{
	te_device_info d;

	/* A bus id the driver filled to the last byte is cut there; a bus id
	 * sysfs does not know has no NUMA node. */
	memset(&d, 0, sizeof d);
	d.numa_node = 5;
	memset(d.pci_bus_id, 'F', sizeof d.pci_bus_id);
	teu_pci_info(&d, true);
	CHECK_EQ(strlen(d.pci_bus_id), sizeof d.pci_bus_id - 1);
	CHECK_EQ(d.numa_node, -1);

	/* No bus id from the driver: none at all, whatever it left there. */
	memset(d.pci_bus_id, 'F', sizeof d.pci_bus_id);
	d.numa_node = 5;
	teu_pci_info(&d, false);
	CHECK_EQ(d.pci_bus_id[0], '\0');
	CHECK_EQ(d.numa_node, 5);
}

static void test_ipc(void)
{
	te_device_ipc ipc;
	unsigned char h[64], back[64];

	memset(&ipc, 0xa5, sizeof ipc);
	for (size_t i = 0; i < sizeof h; i++)
		h[i] = (unsigned char)(i * 7 + 1);
	teu_ipc_fill(&ipc, h, sizeof h, 3, -1, 0x7000, 0x2000);
	CHECK_EQ(ipc.handle_len, sizeof h);
	CHECK(memcmp(ipc.handle, h, sizeof h) == 0);
	CHECK_EQ(ipc.device, 3);
	CHECK_EQ(ipc.fd, -1);
	CHECK(ipc.alloc_base == 0x7000 && ipc.alloc_size == 0x2000);

	CHECK_EQ(teu_ipc_handle(&ipc, back, sizeof back), 0);
	CHECK(memcmp(back, h, sizeof h) == 0);
	CHECK_EQ(teu_ipc_handle(&ipc, back, 4), -EINVAL); /* another vendor's handle */

	CHECK_EQ(teu_ipc_device(&ipc, 4), 3);
	CHECK_EQ(teu_ipc_device(&ipc, 3), 0); /* no such device here */
	ipc.device = -1;
	CHECK_EQ(teu_ipc_device(&ipc, 4), 0);
}

static void test_json(void)
{
	JsonBuilder *b = json_builder_new();
	size_t len = 0;

	json_builder_begin_object(b);
	json_builder_set_member_name(b, "name");
	json_builder_add_string_value(b, "a\"b");
	json_builder_set_member_name(b, "n");
	json_builder_begin_array(b);
	json_builder_add_int_value(b, -3);
	json_builder_add_boolean_value(b, TRUE);
	json_builder_end_array(b);
	json_builder_end_object(b);
	char *t = teu_json_finish(b, &len); /* b is released: ASan sees a leak if not */
	CHECK(t != NULL && strcmp(t, "{\"name\":\"a\\\"b\",\"n\":[-3,true]}") == 0);
	CHECK_EQ(len, strlen(t));
	free(t); /* malloc()'s memory: what a plugin's host frees */

	JsonNode *n = json_node_new(JSON_NODE_ARRAY);
	json_node_take_array(n, json_array_new());
	t = teu_json_text(n, NULL);
	CHECK(t != NULL && strcmp(t, "[]") == 0);
	free(t);
	CHECK_EQ(json_node_get_array(n) != NULL, 1); /* the node stays the caller's */
	json_node_unref(n);

	b = json_builder_new(); /* a document left open has no text */
	json_builder_begin_object(b);
	len = 99;
	CHECK(teu_json_finish(b, &len) == NULL);
	CHECK_EQ(len, 99);
}

static void verror(const char *prog, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	teu_fmt_verror(prog, fmt, ap);
	va_end(ap);
}

/* The benchmarks' error line, caught from stderr through a file. */
static void test_verror(void)
{
	char line[64] = "";
	FILE *f = tmpfile();
	int saved = dup(STDERR_FILENO);

	CHECK(f != NULL && saved >= 0);
	if (f == NULL || saved < 0)
		return;
	fflush(stderr);
	CHECK(dup2(fileno(f), STDERR_FILENO) >= 0);
	verror("bench", "--size=%s: want %d", "x", 3);
	fflush(stderr);
	CHECK(dup2(saved, STDERR_FILENO) >= 0);
	close(saved);
	rewind(f);
	size_t n = fread(line, 1, sizeof line - 1, f);
	line[n] = '\0';
	fclose(f);
	CHECK(strcmp(line, "bench: --size=x: want 3\n") == 0);
}

int main(void)
{
	TEST_RUN(test_split);
	TEST_RUN(test_names);
	TEST_RUN(test_redact);
	TEST_RUN(test_range);
	TEST_RUN(test_search);
	TEST_RUN(test_dlist);
	TEST_RUN(test_range_check);
	TEST_RUN(test_pci_info);
	TEST_RUN(test_ipc);
	TEST_RUN(test_json);
	TEST_RUN(test_verror);
	return check_done();
}
