package troupe

import (
	"fmt"
	"net"
	"os"
	"slices"
)

// allowPeerUID decides whether a Unix socket peer running as uid may
// connect: this process's own user or one of [Config.AllowUIDs]. pid is
// for the log and the rejection only; 0 where the platform does not say.
func (n *Node) allowPeerUID(uid, pid int) error {
	if uid == os.Getuid() || slices.Contains(n.cfg.AllowUIDs, uid) {
		return nil
	}
	n.log.Warn("troupe: refused a unix socket peer of another user", "uid", uid, "pid", pid)
	return fmt.Errorf("%w: unix peer uid %d (pid %d) is not allowed; this node accepts uid %d and Config.AllowUIDs", ErrRejected, uid, pid, os.Getuid())
}

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
