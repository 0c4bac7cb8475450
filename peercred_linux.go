package troupe

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// peerCredSupported says that this platform tells a Unix socket server
// who connected (SO_PEERCRED).
const peerCredSupported = true

// checkPeerCred reads the credentials of the process at the other end of a
// Unix socket (SO_PEERCRED) and asks allow (the gate's allowPeerUID)
// whether its user may connect. Other connections pass.
func checkPeerCred(c net.Conn, allow func(uid, pid int) error) error {
	var cred *unix.Ucred
	isUnix, err := unixConnFD(c, func(fd int) (err error) {
		cred, err = unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		return err
	})
	switch {
	case !isUnix:
		return nil
	case err != nil:
		return fmt.Errorf("read unix peer credentials: %w", err)
	}
	return allow(int(cred.Uid), int(cred.Pid))
}
