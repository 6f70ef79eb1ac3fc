package mqtt_test

import (
	"net"
	"sync/atomic"
)

// muteConn is a connection whose writes, once muted, are swallowed: they
// report success and reach nobody.
type muteConn struct {
	net.Conn
	muted atomic.Bool
}

func (c *muteConn) Write(b []byte) (int, error) {
	if c.muted.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}
