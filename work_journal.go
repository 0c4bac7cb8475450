package troupe

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// A producer's journal (WorkConfig.Journal): the unconfirmed jobs, kept
// in a directory so that a producer started again after a crash hands
// them out again. Standard library only.
//
// The directory holds a LOCK file, locked while a producer uses it, and
// segments named by a hexadecimal number, "0000000000000001.journal", each
// a sequence of records:
//
//	u32 n | kind (1 byte) | body (n-1 bytes) | u32 CRC-32C of kind and body
//
// (integers big-endian). Kinds: 'T' the job type (uvarint length, wire
// key, then the type's shape, see shape.go), first in every segment; 'I'
// the producer's identity (16 bytes) and the highest job number used so
// far (uvarint), second; 'J' a job (uvarint number, then the job's
// payload, encoded as on the wire); 'C' a confirmation (uvarint number).
// Only the last segment is written, and only it is read back: when it
// grows past twice the live jobs' bytes (and 4 MiB), a new one starts
// with the live jobs (compaction), written as NAME.journal.tmp, synced and
// renamed into place whole, so that the last segment always holds every
// live job; then the old ones are removed (a crash before that leaves
// them, unread, for the next open to remove). A
// record cut short or failing its CRC at the end of the last segment (a
// crash mid-write) is dropped — a record whose length runs past the end of
// the file, or the file's last record failing its CRC; anywhere else it is
// an error.

// workStore is where a producer keeps its unconfirmed jobs, encoded as
// on the wire: the seam for another store (a database, a replicated
// log) beside the file journal, the one built in. Opening one returns the
// producer's identity, the highest number it used and the unconfirmed
// jobs (see openJournal).
type workStore interface {
	// add keeps job seq; when it returns, the job outlives the process
	// (as the store's durability promises).
	add(seq uint64, payload []byte) error
	// confirm drops job seq.
	confirm(seq uint64) error
	// close releases the store, keeping the unconfirmed jobs for the
	// next producer.
	close() error
}

var _ workStore = (*workJournal)(nil)

// liveBytes is what a live job's record takes in a segment: its payload,
// and at most 19 bytes of length, kind, number and CRC.
func liveBytes(payload []byte) int64 { return int64(len(payload)) + 19 }

// journalSegmentMin is the size past which a segment may be compacted.
const journalSegmentMin = 4 << 20

// maxJournalRecord bounds one record (a job's payload and its header).
const maxJournalRecord = 1 << 30

var journalCRC = crc32.MakeTable(crc32.Castagnoli)

// errJournal wraps every error about a journal's files.
var errJournal = errors.New("troupe: work journal")

type workJournal struct {
	dir  string
	sync bool
	mt   *msgType
	lock *os.File

	syncMu mutex[lkJournalSync] // one fsync or compaction at a time
	synced uint64               // records known on disk (under syncMu)

	mu      mutex[lkJournal]
	f       *os.File
	seg     uint64 // the segment written
	size    int64  // its size
	written uint64 // records written, all segments
	live    map[uint64][]byte
	bytes   int64  // the live jobs' records' bytes (see liveBytes)
	id      UUID   // the producer's identity, kept across its restarts
	top     uint64 // the highest job number used (what recovery found)
	err     error  // the first write error: the journal is then closed
}

// journaled is a job found in the journal when it was opened.
type journaled struct {
	seq     uint64
	payload []byte
}

// openJournal opens (or creates) the journal in dir for jobs of mt and
// returns its unconfirmed jobs in order and the highest number it used.
func openJournal(dir string, sync bool, mt *msgType) (*workJournal, []journaled, uint64, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, 0, fmt.Errorf("%w: %v", errJournal, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("%w: %v", errJournal, err)
	}
	if err := tryFlock(lock); err != nil {
		lock.Close()
		return nil, nil, 0, fmt.Errorf("%w: %s is in use by another producer (%v)", errJournal, dir, err)
	}
	j := &workJournal{dir: dir, sync: sync, mt: mt, lock: lock, live: map[uint64][]byte{}}
	segs, err := j.segments()
	if err == nil && len(segs) > 0 {
		// Each segment starts with every job live when it was made, and
		// is renamed into place whole: the last one holds the journal,
		// and the ones before it are what a compaction cut short by a
		// crash had not yet removed.
		err = j.recover(segs[len(segs)-1])
	}
	if err == nil && j.id == (UUID{}) {
		_, err = rand.Read(j.id[:])
	}
	if err == nil {
		leftovers, _ := filepath.Glob(filepath.Join(dir, "*.journal.tmp"))
		for _, f := range leftovers { // a compaction's, cut short
			os.Remove(f)
		}
		err = j.compact(segs)
	}
	if err != nil {
		lock.Close()
		return nil, nil, 0, err
	}
	out := make([]journaled, 0, len(j.live))
	for seq, b := range j.live {
		out = append(out, journaled{seq: seq, payload: b})
	}
	slices.SortFunc(out, func(a, b journaled) int { return compareU64(a.seq, b.seq) })
	return j, out, j.top, nil
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// segments lists the segments' numbers in order.
func (j *workJournal) segments() ([]uint64, error) {
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errJournal, err)
	}
	var out []uint64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".journal")
		if !ok || len(name) != 16 {
			continue
		}
		var n uint64
		if _, err := fmt.Sscanf(name, "%016x", &n); err == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (j *workJournal) segPath(n uint64) string {
	return filepath.Join(j.dir, fmt.Sprintf("%016x.journal", n))
}

// recover reads segment n, the last, into the live table.
func (j *workJournal) recover(n uint64) (err error) {
	header := 0 // the type and identity records read
	{
		b, err := os.ReadFile(j.segPath(n))
		if err != nil {
			return fmt.Errorf("%w: %v", errJournal, err)
		}
		var cv *conv // converts jobs of another version of the type
		off := 0
		for off < len(b) {
			kind, body, next, ok := readJournalRecord(b, off)
			if !ok {
				if header == 2 && journalTail(b, off) {
					break // the tail of a write cut short by a crash
				}
				return fmt.Errorf("%w: segment %s is damaged at byte %d", errJournal, j.segPath(n), off)
			}
			off = next
			switch kind {
			case 'T':
				header++
				key, shape, err := parseJournalType(body)
				if err != nil {
					return fmt.Errorf("%w: segment %s: %v", errJournal, j.segPath(n), err)
				}
				if key != j.mt.key {
					return fmt.Errorf("%w: %s holds jobs of %q, not %q", errJournal, j.dir, key, j.mt.key)
				}
				cv = nil
				if j.mt.shape != nil && shape != nil && string(shape) != string(j.mt.shape) {
					s, err := parseShape(shape)
					if err == nil {
						cv, err = buildConv(s, j.mt.t)
					}
					if err != nil {
						return fmt.Errorf("%w: the jobs in %s do not decode into %s: %v", errJournal, j.dir, j.mt.t, err)
					}
				}
			case 'I':
				header++
				if len(body) < 17 {
					return fmt.Errorf("%w: segment %s: a malformed identity", errJournal, j.segPath(n))
				}
				copy(j.id[:], body[:16])
				t, k := binary.Uvarint(body[16:])
				if k <= 0 {
					return fmt.Errorf("%w: segment %s: a malformed identity", errJournal, j.segPath(n))
				}
				j.top = max(j.top, t)
			case 'J':
				seq, k := binary.Uvarint(body)
				if k <= 0 {
					return fmt.Errorf("%w: segment %s: a job without a number", errJournal, j.segPath(n))
				}
				payload := body[k:]
				if cv != nil {
					if payload, err = j.upgrade(cv, payload); err != nil {
						return fmt.Errorf("%w: job %d in %s: %v", errJournal, seq, j.dir, err)
					}
				}
				if old, ok := j.live[seq]; ok {
					j.bytes -= liveBytes(old)
				}
				j.bytes += liveBytes(payload)
				j.live[seq] = slices.Clone(payload)
				j.top = max(j.top, seq)
			case 'C':
				for len(body) > 0 {
					seq, k := binary.Uvarint(body)
					if k <= 0 {
						return fmt.Errorf("%w: segment %s: a malformed confirmation", errJournal, j.segPath(n))
					}
					body = body[k:]
					if old, ok := j.live[seq]; ok {
						j.bytes -= liveBytes(old)
						delete(j.live, seq)
					}
				}
			}
		}
		if header != 2 {
			return fmt.Errorf("%w: segment %s is damaged: it does not begin with the job type and the producer's identity", errJournal, j.segPath(n))
		}
		j.seg = n
	}
	return nil
}

// journalTail reports whether the unreadable record at off is what a
// write cut short by a crash leaves: fewer than its four length bytes, a
// length in bounds that runs past the end, the file's last record (its
// CRC failed), or nothing but zeros (a file extended, not yet written). A
// damaged record with more after it is damage, not a crash.
func journalTail(b []byte, off int) bool {
	rest := int64(len(b) - off)
	if rest < 4 {
		return true
	}
	if !slices.ContainsFunc(b[off:], func(c byte) bool { return c != 0 }) {
		return true
	}
	n := int64(binary.BigEndian.Uint32(b[off:]))
	return n >= 1 && n <= maxJournalRecord && rest <= n+8
}

// upgrade re-encodes a payload written by another version of the job's
// type in this version's layout.
func (j *workJournal) upgrade(c *conv, payload []byte) ([]byte, error) {
	d := &decoder{binder: nil}
	v, err := d.convert(j.mt, c, payload)
	if err != nil {
		return nil, err
	}
	var e encoder
	return e.payload(nil, j.mt, v)
}

// readJournalRecord reads the record at off; ok is false if it is cut
// short or damaged.
func readJournalRecord(b []byte, off int) (kind byte, body []byte, next int, ok bool) {
	if len(b)-off < 4 {
		return 0, nil, 0, false
	}
	n64 := int64(binary.BigEndian.Uint32(b[off:]))
	if n64 < 1 || n64 > maxJournalRecord || int64(len(b)-off) < n64+8 {
		return 0, nil, 0, false
	}
	n := int(n64)
	rec := b[off+4 : off+4+n]
	if crc32.Checksum(rec, journalCRC) != binary.BigEndian.Uint32(b[off+4+n:]) {
		return 0, nil, 0, false
	}
	return rec[0], rec[1:], off + 8 + n, true
}

func parseJournalType(body []byte) (key string, shape []byte, err error) {
	n, k := binary.Uvarint(body)
	if k <= 0 || n > uint64(len(body)-k) {
		return "", nil, errors.New("a malformed type record")
	}
	key = string(body[k : k+int(n)])
	if rest := body[k+int(n):]; len(rest) > 0 {
		shape = rest
	}
	return key, shape, nil
}

// appendJournalRecord appends a record of kind with body's parts.
func appendJournalRecord(b []byte, kind byte, parts ...[]byte) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, kind)
	for _, p := range parts {
		b = append(b, p...)
	}
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start+4:], journalCRC))
}

// header appends a segment's first records: the type, the identity and
// the highest number used.
func (j *workJournal) header(b []byte) []byte {
	key := binary.AppendUvarint(nil, uint64(len(j.mt.key)))
	b = appendJournalRecord(b, 'T', key, []byte(j.mt.key), j.mt.shape)
	return appendJournalRecord(b, 'I', j.id[:], binary.AppendUvarint(nil, j.top))
}

// compact starts a new segment with the live jobs, makes it durable,
// and removes the segments before it (old). Under syncMu and mu, or
// before the journal is shared.
func (j *workJournal) compact(old []uint64) error {
	next := j.seg + 1
	tmp := j.segPath(next) + ".tmp" // renamed into place once whole and synced
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %v", errJournal, err)
	}
	seqs := make([]uint64, 0, len(j.live))
	for seq := range j.live {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	buf := j.header(nil)
	var size int64
	for _, seq := range seqs {
		buf = appendJournalRecord(buf, 'J', binary.AppendUvarint(nil, seq), j.live[seq])
		if len(buf) > 1<<20 {
			if _, err := f.Write(buf); err != nil {
				f.Close()
				os.Remove(tmp)
				return fmt.Errorf("%w: %v", errJournal, err)
			}
			size += int64(len(buf))
			buf = buf[:0]
		}
	}
	_, err = f.Write(buf)
	size += int64(len(buf))
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, j.segPath(next))
	}
	if err != nil {
		f.Close()
		os.Remove(tmp) // the segment written goes on as before
		return fmt.Errorf("%w: %v", errJournal, err)
	}
	syncDir(j.dir) // the new segment is in place before the old go
	for _, n := range old {
		if n < next {
			os.Remove(j.segPath(n))
		}
	}
	syncDir(j.dir)
	if j.f != nil {
		j.f.Close()
	}
	j.f, j.seg, j.size = f, next, size
	j.synced = j.written
	return nil
}

// syncDir makes a directory's entries durable where the platform can.
func syncDir(dir string) {
	if runtime.GOOS == "windows" {
		return
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// add writes job seq and, if the journal syncs, returns once it is on
// disk (fsyncs of writers that meet are shared).
func (j *workJournal) add(seq uint64, payload []byte) error {
	rec := appendJournalRecord(nil, 'J', binary.AppendUvarint(nil, seq), payload)
	if len(rec) > maxJournalRecord {
		return fmt.Errorf("%w: a job of %d bytes is too big for the journal", errJournal, len(payload))
	}
	j.mu.Lock()
	if err := j.write(rec); err != nil {
		j.mu.Unlock()
		return err
	}
	j.live[seq] = payload
	j.bytes += liveBytes(payload)
	j.top = max(j.top, seq)
	mine := j.written
	full := j.size > max(journalSegmentMin, 2*j.bytes)
	j.mu.Unlock()
	if j.sync || full {
		return j.flush(mine, full)
	}
	return nil
}

// confirm drops job seq (not synced: a confirmation lost to a crash only
// hands the job out once more).
func (j *workJournal) confirm(seq uint64) error {
	rec := appendJournalRecord(nil, 'C', binary.AppendUvarint(nil, seq))
	j.mu.Lock()
	defer j.mu.Unlock()
	if p, ok := j.live[seq]; ok {
		j.bytes -= liveBytes(p)
		delete(j.live, seq)
	}
	return j.write(rec)
}

// write appends a record to the segment (under mu).
func (j *workJournal) write(rec []byte) error {
	if j.err != nil {
		return j.err
	}
	if _, err := j.f.Write(rec); err != nil {
		j.err = fmt.Errorf("%w: %v", errJournal, err)
		return j.err
	}
	j.size += int64(len(rec))
	j.written++
	return nil
}

// flush makes the records up to mine durable, and compacts if asked. A
// compaction that fails is tried again by a later write (the segment
// grows meanwhile): the records are written, and the sync below says
// whether they are durable.
func (j *workJournal) flush(mine uint64, compact bool) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	if j.err != nil { // closed (a Send that met Close), or failed
		err := j.err
		j.mu.Unlock()
		return err
	}
	if compact && j.size > max(journalSegmentMin, 2*j.bytes) {
		_ = j.compact([]uint64{j.seg}) // (on failure, the segment written goes on)
	}
	j.mu.Unlock()
	if !j.sync || j.synced >= mine {
		return nil
	}
	j.mu.Lock()
	f, upto := j.f, j.written
	j.mu.Unlock()
	if err := f.Sync(); err != nil {
		// What was written may be lost: nothing after it is promised
		// either (the journal is closed to writes).
		j.mu.Lock()
		if j.err == nil {
			j.err = fmt.Errorf("%w: %v", errJournal, err)
		}
		err = j.err
		j.mu.Unlock()
		return err
	}
	j.synced = upto
	return nil
}

// close closes the files; the unconfirmed jobs stay for the next
// producer.
func (j *workJournal) close() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	var err error
	if j.f != nil {
		if j.err == nil {
			err = j.f.Sync()
		}
		j.f.Close()
		j.f = nil
	}
	if j.err == nil {
		j.err = fmt.Errorf("%w: closed", errJournal)
	}
	// Unlocked before it is closed: a child process forked meanwhile
	// shares the open file, and with it the lock, until it execs.
	flock(j.lock, false)
	j.lock.Close()
	return err
}

// journalBinder binds the refs of a job read back from the journal: a ref
// to another node's actor is bound as Resolve binds one (without asking);
// one to an actor of the producer's own node was an actor of the node's
// earlier incarnation, gone with it, and is bound dead.
type journalBinder struct{ n *Node }

func (b journalBinder) bindRef(kind byte, key refKey, addr string) *handle {
	if kind != refThird || key.node == b.n.uid {
		return deadHandle(b.n, key)
	}
	ad, err := ParseAddr(addr)
	if err != nil || b.n.isOwnAddr(ad) {
		return deadHandle(b.n, key)
	}
	a, err := b.n.peers.assocFor(ad)
	if err != nil {
		return deadHandle(b.n, key)
	}
	return &handle{node: b.n, key: key, assoc: a}
}
