/* SPDX-License-Identifier: Apache-2.0 */
/* newer-call: a program that calls a function of API 1.1
 * (te_last_error_clear) beside one of 1.0 (te_version). check-versions.sh
 * runs it against libte and against a libte that stops at TE_1.0, where the
 * loader must refuse it before main() runs. */
#include <stdio.h>

#include <te/te.h>

int main(void)
{
	te_last_error_clear();
	printf("libte %s\n", te_version());
	return 0;
}
