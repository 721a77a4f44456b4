/* SPDX-License-Identifier: Apache-2.0 */
/* host-services: the host's services by topic (te-host.h, plugin ABI 1.13).
 * Every topic is found, at its own size and version, and hands out the very
 * functions of the flat te_host table; an unknown topic, a NULL one and a
 * version newer than the host's are refused; te_host_service() asks a host
 * older than 1.13 nothing. Built from libte's objects, as a plugin sees the
 * table of te_host_init(). */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static int failures;

#define CHECK(cond)                                                                    \
	do {                                                                           \
		if (!(cond)) {                                                         \
			printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
			failures++;                                                    \
		}                                                                      \
	} while (0)

/* The table of `topic` at its own version: found, sized and versioned as
 * this header builds it, refused one version later. NULL when absent. */
#define LOOKUP(h, type, topic, version)                                                \
	((const type *)lookup((h), (topic), (version), sizeof(type)))

static const void *lookup(const te_host *h, const char *topic, uint32_t version, size_t size)
{
	const void *t = te_host_service(h, topic, version);

	if (t == NULL) {
		printf("FAIL: no topic '%s' at version %u\n", topic, version);
		failures++;
		return NULL;
	}
	/* Every table begins with its size and version. */
	uint32_t head[2];
	memcpy(head, t, sizeof head);
	if (head[0] != size || head[1] != version) {
		printf("FAIL: topic '%s' has size %u version %u, expected %zu and %u\n", topic, head[0],
		       head[1], size, version);
		failures++;
	}
	if (te_host_service(h, topic, 0) != t || te_host_service(h, topic, 1) != t) {
		printf("FAIL: topic '%s' differs by the version asked for\n", topic);
		failures++;
	}
	if (te_host_service(h, topic, version + 1) != NULL) {
		printf("FAIL: topic '%s' offered at version %u, newer than its own\n", topic, version + 1);
		failures++;
	}
	return t;
}

/* The topic's member is the flat table's, and set. */
#define SAME(t, h, member)                                                             \
	do {                                                                           \
		CHECK((t)->member == (h)->member);                                     \
		CHECK((t)->member != NULL);                                            \
	} while (0)

int main(void)
{
	te_host_ctx hc;
	te_host_init(&hc, NULL, NULL);
	const te_host *h = &hc.host;

	CHECK(h->abi_minor == TE_PLUGIN_ABI_MINOR);
	CHECK(TE_HAS_OP(h, service));

	const te_log_service *log = LOOKUP(h, te_log_service, TE_SERVICE_LOG, TE_SERVICE_LOG_VERSION);
	if (log != NULL) {
		SAME(log, h, log);
		SAME(log, h, config);
	}
	const te_transfer_service *tr =
		LOOKUP(h, te_transfer_service, TE_SERVICE_TRANSFER, TE_SERVICE_TRANSFER_VERSION);
	if (tr != NULL) {
		SAME(tr, h, complete);
		SAME(tr, h, canceled);
		SAME(tr, h, transfer_enter);
		SAME(tr, h, transfer_leave);
		SAME(tr, h, transfer_deadline);
		SAME(tr, h, transfer_stale);
		SAME(tr, h, buffer_acquire);
		SAME(tr, h, buffer_release);
		SAME(tr, h, buffer_acquire_revocable);
		SAME(tr, h, buffer_enter);
		SAME(tr, h, buffer_leave);
		SAME(tr, h, buffer_is_device);
		SAME(tr, h, buffer_copy);
		SAME(tr, h, buffer_copy_batch);
		SAME(tr, h, shared_memory);
	}
	const te_control_service *ctl =
		LOOKUP(h, te_control_service, TE_SERVICE_CONTROL, TE_SERVICE_CONTROL_VERSION);
	if (ctl != NULL) {
		SAME(ctl, h, rpc_handle);
		SAME(ctl, h, rpc_call);
		SAME(ctl, h, republish);
		SAME(ctl, h, buffer_fields);
		SAME(ctl, h, local_name);
		SAME(ctl, h, local_address);
	}
	const te_auth_service *auth = LOOKUP(h, te_auth_service, TE_SERVICE_AUTH, TE_SERVICE_AUTH_VERSION);
	if (auth != NULL) {
		SAME(auth, h, auth_enabled);
		SAME(auth, h, auth_connect);
		SAME(auth, h, auth_accept);
	}
	const te_device_service *dev =
		LOOKUP(h, te_device_service, TE_SERVICE_DEVICE, TE_SERVICE_DEVICE_VERSION);
	if (dev != NULL) {
		SAME(dev, h, devices);
		SAME(dev, h, device_dmabuf);
		SAME(dev, h, device_ipc_export);
		SAME(dev, h, device_ipc_open);
		SAME(dev, h, device_ipc_close);
		SAME(dev, h, device_copy);
		SAME(dev, h, device_copy_batch);
		SAME(dev, h, host_buffer_alloc);
		SAME(dev, h, host_buffer_free);
		SAME(dev, h, device_done_burst);
	}
	const te_metrics_service *met =
		LOOKUP(h, te_metrics_service, TE_SERVICE_METRICS, TE_SERVICE_METRICS_VERSION);
	if (met != NULL) {
		/* Counting compiled out (-Dmetrics=false): both tables lack the
		 * counters alike. */
		CHECK(met->metric_device == h->metric_device);
		CHECK(met->metric_add == h->metric_add);
		SAME(met, h, metrics_text);
	}

	/* Names are exact: no other spelling, prefix or extension. */
	static const char *const unknown[] = { "nosuch", "", "LOG", "lo", "log2", "transfer ", "metric" };
	for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
		if (te_host_service(h, unknown[i], 0) != NULL) {
			printf("FAIL: unknown topic '%s' found\n", unknown[i]);
			failures++;
		}
	CHECK(h->service(h, NULL, 0) == NULL);
	CHECK(te_host_service(h, TE_SERVICE_LOG, UINT32_MAX) == NULL);

	/* A host before 1.13: its table ends before service(), and the helper
	 * reads nothing past it. */
	te_host old = *h;
	old.size = (uint32_t)offsetof(te_host, service); /* service() itself stays set */
	CHECK(!TE_HAS_OP(&old, service));
	CHECK(te_host_service(&old, TE_SERVICE_LOG, 1) == NULL);

	if (failures) {
		printf("%d checks failed\n", failures);
		return 1;
	}
	printf("6 topics found at their versions; unknown topics and newer versions refused\n");
	return 0;
}
