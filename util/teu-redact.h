/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connection strings and URLs for logs, their passwords hidden: libte names
 * the metadata connection it opened, the HTTP client and the metadata
 * plugins the URLs they reach, te-top the endpoint it scrapes.
 */
#ifndef TEU_REDACT_H
#define TEU_REDACT_H

/* `url` with the password of its user-info ("user:password@host") replaced
 * by "***": "etcd://u:***@h:2379". The host part ends at the first '/', '?'
 * or '#' (a password holding those must be percent-encoded); its last '@'
 * ends the user-info, so a raw '@' in a password is hidden too. A copy of
 * `url` when it has no password, "(null)" for NULL; g_free() it. */
char *teu_redact(const char *url);

#endif
