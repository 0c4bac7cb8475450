// Package hostnet builds small networks of real Linux network namespaces
// for fault tests: each host is a namespace with its own address on a
// shared bridge, programs run inside a host with [Host.Command], and faults
// are injected per direction with ip and nftables — links cut, traffic
// dropped one way or both, random loss — plus delay and jitter through a
// userspace relay, for kernels without the netem qdisc.
//
// It needs root, ip (iproute2) and nft (nftables); [New] skips the test
// with a message when they are missing. Every namespace, link and rule it
// makes is removed by the test's cleanup, and it assigns all addresses
// itself, inside its own namespaces.
//
// It builds only on Linux.
package hostnet
