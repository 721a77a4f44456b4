/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin ABI of libte: what a plugin implements and what the host offers
 * it. A plugin is one shared object that exports one symbol,
 * te_plugin_entry(), returning a descriptor; TE_PLUGIN_DEFINE() writes it.
 * The plugin does not link against libte: everything it needs from the host
 * comes through the te_host table handed to it.
 *
 * This header holds the descriptor, the entry point and the types shared by
 * several kinds; each kind's ops table has a header of its own, which this
 * one includes, as it includes the host's (docs/plugins.md, "Writing a
 * plugin"):
 *
 *   te-host.h       te_host, the host's services by topic, helpers
 *   te-transport.h  te_transport_ops   (TE_KIND_TRANSPORT)
 *   te-metadata.h   te_metadata_ops    (TE_KIND_METADATA)
 *   te-device.h     te_device_ops      (TE_KIND_DEVICE)
 *   te-exporter.h   te_exporter_ops    (TE_KIND_EXPORTER)
 *
 * Versioning: the host loads a plugin iff its magic matches, its ABI major
 * equals the host's and its ABI minor is not newer than the host's. Every ops
 * table and the host table begin with their size as built, so either side can
 * tell whether an optional member exists: use TE_HAS_OP(table, member).
 *
 * Memory: strings and buffers a plugin returns to the host (reply bodies,
 * JSON fragments, values) are allocated with malloc() and freed by the host
 * with free(), and the other way round for what the host returns.
 */
#ifndef TE_TE_PLUGIN_H
#define TE_TE_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <te/te.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TE_PLUGIN_MAGIC 0x4c505445u /* "ETPL" in memory order on LE */
#define TE_PLUGIN_ABI_MAJOR 1
#define TE_PLUGIN_ABI_MINOR 13
#define TE_PLUGIN_ENTRY_SYMBOL "te_plugin_entry"

/* True when `tbl` was built with `member` and it is set. */
#define TE_HAS_OP(tbl, member)                                                   \
	((tbl)->size >= offsetof(__typeof__(*(tbl)), member) + sizeof((tbl)->member) && \
	 (tbl)->member != NULL)

#if defined(__GNUC__)
#define TE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TE_PRINTF(a, b)
#endif

/* RPC frame types of the handshake socket (docs/wire.md, "RPC frames"). */
enum te_rpc_type {
	TE_RPC_CONNECTION = 0,
	TE_RPC_METADATA = 1,
	TE_RPC_NOTIFY = 2,
	TE_RPC_PROBE = 3,
};

/* Channel kinds of peer authentication (auth_connect/auth_accept): a proof
 * made for one kind is refused on another. A plugin with connections of its
 * own kind uses a value from 16 to 255. */
enum te_auth_channel {
	TE_AUTH_RPC = 1, /* the host's RPC/handshake socket */
	TE_AUTH_TCP = 2, /* the tcp plugin's data connections */
};

/* --------------------------------------------------------- shared structs */

/* One request handed to a transport. The host owns it; it stays valid until
 * the plugin's last complete() call for it. */
typedef struct te_transfer {
	uint32_t opcode;            /* TE_OP_READ or TE_OP_WRITE */
	/* Number of complete() calls that finish this transfer. The host sets 1;
	 * a plugin that splits the transfer sets it before its first complete(). */
	uint32_t nr_slices;
	void *local;                /* registered local memory */
	uint64_t remote;            /* remote address, or file offset */
	uint64_t length;            /* never 0: the host completes empty requests */
	void *seg_ctx;              /* what segment_open() returned */
	const char *local_location; /* location of the local buffer, e.g. "cpu:0" */
	uintptr_t plugin_data[4];   /* free for the plugin */
} te_transfer;

/* A registered local buffer pinned against unregistration. */
typedef struct te_buffer_pin {
	void *addr;             /* the whole registered region */
	uint64_t length;
	const char *location;
	unsigned flags;         /* TE_MEM_* */
	void *priv;             /* host's */
} te_buffer_pin;

/* One device a device plugin drives, for te-info and topology. */
typedef struct te_device_info {
	uint32_t size;        /* sizeof(te_device_info) as the host built it */
	char location[32];    /* "cuda:0" */
	char name[96];        /* product name */
	uint64_t memory;      /* bytes of device memory, 0 when unknown */
	char pci_bus_id[32];  /* "0000:3b:00.0", "" when unknown */
	int numa_node;        /* -1 when unknown */
} te_device_info;

/* What another process of this host needs to reach a device allocation
 * (since ABI 1.3): a CUDA IPC handle, a file descriptor, or both. Filled by
 * the exporting side's device plugin, read by the importing side's. */
#define TE_DEVICE_IPC_BYTES 128
typedef struct te_device_ipc {
	uint32_t size;        /* sizeof(te_device_ipc) as its writer built it */
	int32_t device;       /* the device's index in the exporting process */
	int32_t fd;           /* a descriptor standing for the allocation, or -1 */
	uint32_t handle_len;  /* bytes of `handle` in use */
	uint8_t handle[TE_DEVICE_IPC_BYTES]; /* opaque to all but the plugin */
	uint64_t alloc_base;  /* the allocation, in the exporter's address space */
	uint64_t alloc_size;
} te_device_ipc;

/* One copy of a batch (since ABI 1.5): `len` bytes from `src` to `dst`. */
typedef struct te_copy {
	void *dst;
	const void *src;
	size_t len;
} te_copy;

enum te_copy_flags {
	/* Every dst and src of the batch is device memory of the one plugin
	 * (an opened export counts): it may move them without a copy engine
	 * call per piece (a gather-copy kernel). A hint: never required. */
	TE_COPY_DEVICE_ONLY = 1u << 0,
};

/* Handles one received RPC frame of a registered type. `body` is the JSON
 * (NUL-terminated, `len` bytes), `peer` the remote address as text. Writes a
 * malloc()ed reply; returns 0, or a negative error to close the connection
 * without a reply. Runs on a host thread; may block briefly. */
typedef int (*te_rpc_handler)(void *user, const char *peer, const char *body, size_t len,
			      char **reply, size_t *reply_len);

/* What the host offers every plugin (te-host.h). */
typedef struct te_host te_host;

/* ------------------------------------------------------------- descriptor */

typedef struct te_plugin_desc {
	uint32_t magic;      /* TE_PLUGIN_MAGIC */
	uint16_t abi_major;  /* TE_PLUGIN_ABI_MAJOR */
	uint16_t abi_minor;  /* TE_PLUGIN_ABI_MINOR */
	uint32_t size;       /* sizeof(te_plugin_desc) as built */
	uint32_t kind;       /* TE_KIND_TRANSPORT, _METADATA, _DEVICE or _EXPORTER */
	const char *name;    /* [a-z0-9_-]{1,31}: "tcp", "etcd", ... */
	const char *version;
	const char *description;
	const char *license;
	const void *ops;     /* the kind's: te_transport_ops, te_metadata_ops, ... */
	void *reserved[4];
} te_plugin_desc;

typedef const te_plugin_desc *(*te_plugin_entry_fn)(void);

/* A plugin kind's name (te_plugin_desc.kind, te_plugin_info.kind):
 * "transport", "metadata", "device", "exporter", or "unknown". */
static inline const char *te_plugin_kind_name(int kind)
{
	return kind == TE_KIND_TRANSPORT  ? "transport"
	       : kind == TE_KIND_METADATA ? "metadata"
	       : kind == TE_KIND_DEVICE   ? "device"
	       : kind == TE_KIND_EXPORTER ? "exporter"
					  : "unknown";
}

#define TE_PLUGIN_DEFINE(kind_, name_, version_, description_, license_, ops_)   \
	__attribute__((visibility("default"))) const te_plugin_desc *te_plugin_entry(void); \
	const te_plugin_desc *te_plugin_entry(void)                                 \
	{                                                                           \
		static const te_plugin_desc desc = {                                    \
			.magic = TE_PLUGIN_MAGIC,                                           \
			.abi_major = TE_PLUGIN_ABI_MAJOR,                                   \
			.abi_minor = TE_PLUGIN_ABI_MINOR,                                   \
			.size = sizeof(te_plugin_desc),                                     \
			.kind = (kind_),                                                    \
			.name = (name_),                                                    \
			.version = (version_),                                              \
			.description = (description_),                                     \
			.license = (license_),                                              \
			.ops = (ops_),                                                      \
		};                                                                      \
		return &desc;                                                           \
	}

#ifdef __cplusplus
}
#endif

/* Each kind's table and the host's, in a header of its own; after the
 * shared types above, which they use. */
#include <te/te-host.h>
#include <te/te-transport.h>
#include <te/te-metadata.h>
#include <te/te-device.h>
#include <te/te-exporter.h>

#endif /* TE_TE_PLUGIN_H */
