package troupe

import (
	"fmt"
	"net"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// checkPeerCred reads the credentials of the process at the other end of a
// Unix socket (SO_PEERCRED) and accepts only this process's user or one of
// [Config.AllowUIDs]. Other connections pass.
func (n *Node) checkPeerCred(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("troupe: read unix peer credentials: %w", credErr)
	}
	uid := int(cred.Uid)
	if uid == os.Getuid() || slices.Contains(n.cfg.AllowUIDs, uid) {
		return nil
	}
	n.log.Warn("troupe: refused a unix socket peer of another user", "uid", uid, "pid", cred.Pid)
	return fmt.Errorf("%w: unix peer uid %d (pid %d) is not allowed; this node accepts uid %d and Config.AllowUIDs", ErrRejected, uid, cred.Pid, os.Getuid())
}
