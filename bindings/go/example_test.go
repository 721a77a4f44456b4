// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"context"
	"fmt"

	"libte.org/te"
)

// Two engines on this machine: one reads the other's memory over TCP.
func Example() {
	src, _ := te.Alloc(4096) // registered memory comes from te.Alloc
	dst, _ := te.Alloc(4096)
	copy(src, "hello over tcp")

	target, _ := te.NewEngine("P2PHANDSHAKE", "127.0.0.1", te.WithTransports("tcp"))
	initiator, _ := te.NewEngine("P2PHANDSHAKE", "127.0.0.1", te.WithTransports("tcp"))
	_ = target.RegisterMemory(src, "cpu:0", te.RemoteAccess)
	_ = initiator.RegisterMemory(dst, "cpu:0")

	seg, _ := initiator.OpenSegment(target.Name())
	bufs, _ := seg.Buffers()
	err := initiator.Read(context.Background(), dst[:14], seg.ID(), bufs[0].Addr)
	fmt.Println(string(dst[:14]), err)

	_ = initiator.Close()
	_ = target.Close()
	fmt.Println(te.Free(src), te.Free(dst))
	// Output:
	// hello over tcp <nil>
	// <nil> <nil>
}
