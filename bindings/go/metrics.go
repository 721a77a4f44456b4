// SPDX-License-Identifier: Apache-2.0

package te

/*
#include "tego.h"
*/
import "C"

import (
	"encoding/json"
	"math"
	"unsafe"
)

// maxCInt bounds what C.GoStringN can take.
const maxCInt = math.MaxInt32

// Stats is every counter of an engine at one moment, as te_engine_stats_json
// gives them (docs/metrics.md describes each). Counting is on unless
// TE_METRICS=0, which makes Stats and MetricsText return ErrNotSupported.
type Stats struct {
	Segment         string                `json:"segment"`
	Transports      []TransportStats      `json:"transports"`
	TransportEvents []TransportEventStats `json:"transport_events"`
	Peers           []PeerStats           `json:"peers"`
	Devices         []DeviceStats         `json:"devices"`
	Notifies        NotifyStats           `json:"notifies"`
	Memory          MemoryStats           `json:"memory"`
	RPC             []RPCStats            `json:"rpc"`
	AuthRefused     uint64                `json:"auth_refused"`
}

// TransportStats counts the tasks of one transport and operation ("read" or
// "write"), from submission to their end.
type TransportStats struct {
	Transport     string           `json:"transport"`
	Op            string           `json:"op"`
	Requests      uint64           `json:"requests"`
	Bytes         uint64           `json:"bytes"`
	Completed     uint64           `json:"completed"`
	Failed        uint64           `json:"failed"`
	Canceled      uint64           `json:"canceled"`
	InFlight      uint64           `json:"in_flight"`
	InFlightBytes uint64           `json:"in_flight_bytes"`
	Latency       LatencyHistogram `json:"latency"`
}

// LatencyHistogram counts task latencies by bucket: Counts[i] tasks took at
// most LeUS[i] microseconds and more than the bound before; the last count,
// one past LeUS, took longer than every bound. Count and SumUS cover all.
type LatencyHistogram struct {
	LeUS   []float64 `json:"le_us"`
	Counts []uint64  `json:"counts"`
	SumUS  float64   `json:"sum_us"`
	Count  uint64    `json:"count"`
}

// TransportEventStats counts what a transport did beyond its tasks.
type TransportEventStats struct {
	Transport string `json:"transport"`
	Retries   uint64 `json:"retries"`
	Failovers uint64 `json:"failovers"`
	Errors    uint64 `json:"errors"`
}

// PeerStats counts one operation to or from one peer segment. Other marks
// the entry that gathers the peers beyond TE_METRICS_PEERS.
type PeerStats struct {
	Peer     string `json:"peer"`
	Other    bool   `json:"other"`
	Op       string `json:"op"`
	Bytes    uint64 `json:"bytes"`
	Requests uint64 `json:"requests"`
	Failed   uint64 `json:"failed"`
}

// DeviceStats is one device a transport named: an RDMA NIC, a TCP rail, an
// NVMe-oF file. BandwidthBytesPerSecond is a moving average.
type DeviceStats struct {
	Transport               string  `json:"transport"`
	Device                  string  `json:"device"`
	Bytes                   uint64  `json:"bytes"`
	InFlightBytes           uint64  `json:"in_flight_bytes"`
	BandwidthBytesPerSecond float64 `json:"bandwidth_bytes_per_second"`
	Retries                 uint64  `json:"retries"`
	Failovers               uint64  `json:"failovers"`
	Errors                  uint64  `json:"errors"`
}

// NotifyStats counts notifications sent and received.
type NotifyStats struct {
	Sent     uint64 `json:"sent"`
	Received uint64 `json:"received"`
}

// MemoryStats is the memory registered now.
type MemoryStats struct {
	RegisteredBytes   uint64 `json:"registered_bytes"`
	RegisteredRegions uint64 `json:"registered_regions"`
}

// RPCStats counts the frames of one kind the engine's RPC port answered or
// refused.
type RPCStats struct {
	Kind    string `json:"kind"`
	Served  uint64 `json:"served"`
	Refused uint64 `json:"refused"`
}

// Transport returns the counters of one transport and operation ("read",
// "write"), or nil when the engine has none for them.
func (s *Stats) Transport(transport, op string) *TransportStats {
	for i := range s.Transports {
		if s.Transports[i].Transport == transport && s.Transports[i].Op == op {
			return &s.Transports[i]
		}
	}
	return nil
}

// Peer returns the counters of one peer segment and operation, or nil.
func (s *Stats) Peer(peer, op string) *PeerStats {
	for i := range s.Peers {
		if s.Peers[i].Peer == peer && s.Peers[i].Op == op && !s.Peers[i].Other {
			return &s.Peers[i]
		}
	}
	return nil
}

// Stats returns every counter of the engine.
func (e *Engine) Stats() (*Stats, error) {
	const op = "Stats"
	var js *C.char
	if _, err := e.call(op, func(h *C.te_engine) C.int { return C.te_engine_stats_json(h, &js) }); err != nil {
		return nil, err
	}
	defer C.te_free(unsafe.Pointer(js))
	var s Stats
	if err := json.Unmarshal([]byte(C.GoString(js)), &s); err != nil {
		return nil, newError(op, ErrProtocol, "libte's statistics are no JSON this package reads: "+err.Error())
	}
	return &s, nil
}

// MetricsText returns the engine's counters in the Prometheus text format
// (version 0.0.4), ready to serve as a scrape answer.
func (e *Engine) MetricsText() (string, error) {
	const op = "MetricsText"
	var text *C.char
	var n C.size_t
	if _, err := e.call(op, func(h *C.te_engine) C.int { return C.te_metrics_text(h, &text, &n) }); err != nil {
		return "", err
	}
	defer C.te_free(unsafe.Pointer(text))
	if text == nil {
		return "", nil
	}
	if n > C.size_t(maxCInt) {
		return "", newError(op, ErrInvalid, "the text is larger than a C int counts")
	}
	return C.GoStringN(text, C.int(n)), nil
}
