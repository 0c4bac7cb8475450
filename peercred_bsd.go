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
// accepts only this process's user or one of [Config.AllowUIDs]. Other
// connections pass.
func (n *Node) checkPeerCred(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Xucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptXucred(int(fd), unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("read unix peer credentials: %w", credErr)
	}
	return n.allowPeerUID(int(cred.Uid), 0)
}
