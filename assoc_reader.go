package troupe

// assocReader is what an association's reader goroutine keeps: the
// session's inbound tables, the decoder, the batch of messages for one
// actor that it delivers at once, and the acknowledgements it owes. Only
// the reader reads or writes it, except that a connection resuming a
// session takes the old reader's tables over before its own reader
// starts (takeOver, resume.go).
type assocReader struct {
	inTypes   []inType
	inTargets []inTarget
	// inShapes holds the shapes the peer sent for wire keys it has not
	// yet defined in the session; shapeBytes counts their bytes (at most
	// maxShapeSession are held).
	inShapes   map[string]*rawShape
	shapeBytes int
	// incompatLogged holds the wire keys whose incompatible messages this
	// session has logged.
	incompatLogged map[string]struct{}
	dec            decoder
	rcvTells       uint64 // tell frames received
	batch          []wireMsg
	batchTo        batchTarget // the target of batch
	batchID        uint64      // its table id (0: none, or defined inline)
	batchPath      string      // its path, for dead letters
	arena          []uint64    // the plain values of batch
	ackQueued      uint64      // the last count handed to the writer to acknowledge
	ackBytes       int         // bytes received since then
}
