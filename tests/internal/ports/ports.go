// Package ports finds free TCP ports on loopback for the throwaway servers
// and clusters the tests start (Postgres, Galera, Patroni and etcd).
package ports

import "net"

// Free returns n distinct TCP ports on 127.0.0.1 that were free a moment
// ago: each is held until all n are found, so none is returned twice.
func Free(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	out := make([]int, n)
	for i := range out {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out[i] = l.Addr().(*net.TCPAddr).Port
	}
	return out, nil
}
