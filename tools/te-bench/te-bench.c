/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-bench: reads or writes blocks between two engines as fast as it can and
 * reports throughput, IOPS and latency. Takes the flags of Mooncake's
 * transfer_engine_bench; with no flags it runs both engines in this process
 * with P2PHANDSHAKE, so it needs no setup at all.
 *
 * This file holds the modes: the checks between flags, target (serves a
 * buffer until Ctrl-C), initiator, and loopback (both engines here);
 * te-bench.h says where the rest lives.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "te-bench.h"

volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* --metrics_linger: the engines stay, idle, so that a scraper sees the
 * run's final counts. Ctrl-C ends it early. */
static void linger(void)
{
	if (F.metrics_linger == 0)
		return;
	uint64_t end = now_ns() + F.metrics_linger * 1000000000ull;
	while (!interrupted && now_ns() < end)
		usleep(20000);
}

static const char *hostname(void)
{
	static char h[256];
	if (gethostname(h, sizeof h - 1) != 0 || h[0] == '\0')
		snprintf(h, sizeof h, "localhost");
	return h;
}

int main(int argc, char **argv)
{
	parse_flags(argc, argv);
	if (F.help) {
		usage(stdout);
		return 0;
	}
	if (F.mode == NULL)
		F.mode = F.segment_id ? "initiator" : "loopback";
	if (strcmp(F.mode, "loopback") && strcmp(F.mode, "target") && strcmp(F.mode, "initiator"))
		die(1, "--mode=%s: want loopback, target or initiator", F.mode);
	if (strcmp(F.memory, "libte") && strcmp(F.memory, "anonymous"))
		die(1, "--memory=%s: want libte or anonymous", F.memory);
	if (F.operation == NULL)
		F.operation = strcmp(F.pattern, "kv") ? "read" : "write";
	if (strcmp(F.operation, "read") && strcmp(F.operation, "write") && strcmp(F.operation, "mixed"))
		die(1, "--operation=%s: want read, write or mixed", F.operation);
	if (unit_bytes(F.report_unit) == 0)
		die(1, "--report_unit=%s: want GB, GiB, Gb, MB, MiB, Mb, KB, KiB or Kb", F.report_unit);
	if (!strcmp(F.mode, "initiator") && (F.segment_id == NULL || !*F.segment_id))
		die(1, "--mode=initiator needs --segment_id=<the target's segment name>");
	if (F.segment_id && strchr(F.segment_id, '/') && !strcmp(F.metadata_server, "P2PHANDSHAKE"))
		die(1, "--segment_id=%s names a file (NVMe-oF) segment, which lives in a metadata store: "
		       "give --metadata_server=etcd://... (or redis://, http://)", F.segment_id);
	if (strcmp(F.pattern, "block") && strcmp(F.pattern, "kv"))
		die(1, "--pattern=%s: want block or kv", F.pattern);
	bool kv = !strcmp(F.pattern, "kv");
	if (kv)
		kv_check_flags();
	if (F.block_size > UINT64_MAX / F.batch_size / F.threads)
		die(1, "block_size*batch_size*threads overflows");
	uint64_t need = kv ? kv_pool_bytes() : F.block_size * F.batch_size * F.threads;
	if (F.buffer_size < need) {
		if (!F.json)
			fprintf(stderr, PROG ": --buffer_size raised to %" PRIu64 " (%s)\n", need,
				kv ? "the KV pool" : "block_size*batch_size*threads");
		F.buffer_size = need;
	}

	if (F.verbose) {
		te_set_log_level(TE_LOG_INFO);
	} else if (getenv("TE_LOG_LEVEL") == NULL && getenv("MC_LOG_LEVEL") == NULL) {
		te_set_log_handler(keep_log, NULL);
		if (F.metrics_addr != NULL || getenv("TE_METRICS_ADDR") != NULL)
			te_set_log_level(TE_LOG_INFO); /* for the endpoint's URL; keep_log drops the rest */
	}
	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (!strcmp(F.mode, "target")) {
		te_engine *e = make_engine(F.local_server_name ? F.local_server_name : hostname(), false);
		/* touched now, so first use by an initiator does not count page faults */
		register_buffer(e, F.buffer_size, F.buffer_size, true, F.use_vram);
		printf("%s: target ready, segment name %s (metadata %s, protocol %s); Ctrl-C stops it\n", PROG,
		       te_engine_name(e), store_for_log(), F.protocol);
		fflush(stdout);
		while (!interrupted)
			pause();
		drop_engines();
		return 0;
	}
	if (!strcmp(F.mode, "initiator")) {
		te_engine *e = make_engine(F.local_server_name ? F.local_server_name : hostname(), false);
		int rc = kv ? run_kv(e, F.segment_id, "initiator") : run_initiator(e, F.segment_id, "initiator");
		linger();
		drop_engines();
		return rc;
	}

	/* loopback: a target and an initiator engine in this process */
	bool p2p = !strcmp(F.metadata_server, "P2PHANDSHAKE");
	char tname[128], iname[128];
	if (p2p) {
		snprintf(tname, sizeof tname, "%s", F.local_server_name ? F.local_server_name : "127.0.0.1");
		snprintf(iname, sizeof iname, "%s", tname);
	} else {
		snprintf(tname, sizeof tname, "te-bench-target-%d", (int)getpid());
		snprintf(iname, sizeof iname, "te-bench-initiator-%d", (int)getpid());
	}
	te_engine *target = make_engine(tname, !p2p);
	register_buffer(target, F.buffer_size, need, true, F.use_vram);
	te_engine *init = make_engine(iname, !p2p);
	int rc = kv ? run_kv(init, te_engine_name(target), "loopback")
		    : run_initiator(init, te_engine_name(target), "loopback");
	linger();
	drop_engines(); /* the initiator first, then the target */
	return rc;
}
