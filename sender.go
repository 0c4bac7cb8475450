package troupe

// Who sent a message, for the few of troupe's own protocols that must
// know (the registrar, the cluster's receptionist, the singleton, the
// sharding coordinator): one mechanism, fed only by the association a
// message arrived on, never by the wire. The association's peer uid is
// the one its handshake admitted, and a connection that claims the uid of
// a session that lives must prove it holds that session (handshake.go),
// so no peer can speak for another.

// sentBy is embedded in each such message. Its fields are unexported: the
// codec never reads or writes them.
type sentBy struct {
	from   NodeUID // the sending node incarnation
	remote bool    // the message came from a peer, not this node
}

// stampable is a message that carries its sender. A type that embeds
// sentBy implements it; registerType notes it (msgType.stamped), and the
// association stamps each one it decodes.
type stampable interface {
	stamped(sentBy) any
}

// stampSender returns msg, from the peer incarnation peer, with its
// sender stamped.
func stampSender(msg any, peer NodeUID) any {
	return msg.(stampable).stamped(sentBy{from: peer, remote: true})
}
