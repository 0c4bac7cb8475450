package troupe

import (
	"net"
)

// unixConnFD runs f on the file descriptor of c if c is a Unix socket
// connection; ok is false for any other connection.
func unixConnFD(c net.Conn, f func(fd int) error) (ok bool, err error) {
	uc, isUnix := c.(*net.UnixConn)
	if !isUnix {
		return false, nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return true, err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return true, err
	}
	return true, ferr
}
