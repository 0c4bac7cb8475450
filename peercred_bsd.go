//go:build darwin || freebsd

package troupe

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// peerCredSupported says that this platform tells a Unix socket server
// who connected (LOCAL_PEERCRED).
const peerCredSupported = true

// checkPeerCred reads the credentials of the process at the other end of a
// Unix socket (LOCAL_PEERCRED; these kernels do not give the pid) and
// asks allow (the gate's allowPeerUID) whether its user may connect. Other
// connections pass.
func checkPeerCred(c net.Conn, allow func(uid, pid int) error) error {
	var cred *unix.Xucred
	isUnix, err := unixConnFD(c, func(fd int) (err error) {
		cred, err = unix.GetsockoptXucred(fd, unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
		return err
	})
	switch {
	case !isUnix:
		return nil
	case err != nil:
		return fmt.Errorf("read unix peer credentials: %w", err)
	}
	return allow(int(cred.Uid), 0)
}
