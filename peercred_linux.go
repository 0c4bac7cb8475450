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
// Unix socket (SO_PEERCRED) and accepts only this process's user or one of
// [Config.AllowUIDs]. Other connections pass.
func (n *Node) checkPeerCred(c net.Conn) error {
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
	return n.allowPeerUID(int(cred.Uid), int(cred.Pid))
}
