package troupe

import "time"

// A member's copy of another member's service entries: moved only by
// the owner's numbered changes, in order, or by a whole set; pure, so
// that every order of messages can be tested.

// recepCopy is this member's copy of another member's set.
type recepCopy struct {
	version uint64
	entries map[recepKey]string // the actor's path, by entry
	pulled  time.Time           // when the whole set was last asked for

	// building is a whole set being received, piece by piece, in order.
	building  bool
	buildV    uint64
	buildNext uint32
	build     []recepEntry
}

// recepMaxParts bounds the pieces of one whole set: a member keeps at
// most maxRegistrationsPerPeer entries of another.
const recepMaxParts = (maxRegistrationsPerPeer + recepPiece - 1) / recepPiece

// fits reports whether e is within the registrars' field limits.
func (e recepEntry) fits() bool {
	return e.Name != "" && len(e.Name) <= maxRegNameLen && len(e.Path) <= maxRegPathLen
}

// delta applies d if it follows the copy's version. It reports whether
// the copy changed, and whether a version is missing (a change lost on
// the way: the whole set is to be asked for). A change that takes the
// copy past maxRegistrationsPerPeer entries is not applied, nor any with
// an entry past the field limits: the sender is not a troupe member that
// keeps its bounds.
func (cp *recepCopy) delta(d recepDelta) (changed, missing bool) {
	switch {
	case d.Version <= d.Base || len(d.Added) > recepPiece || len(d.Removed) > recepPiece:
		return false, false // malformed
	case d.Version <= cp.version:
		return false, false // old: the copy has it
	case d.Base != cp.version:
		return false, true
	}
	grow := 0
	for _, e := range d.Added {
		if !e.fits() || e.Path == "" {
			return false, false
		}
		if _, ok := cp.entries[recepKey{e.Name, e.UUID}]; !ok {
			grow++
		}
	}
	if len(cp.entries)+grow > maxRegistrationsPerPeer {
		return false, false
	}
	for _, e := range d.Removed {
		delete(cp.entries, recepKey{e.Name, e.UUID})
	}
	for _, e := range d.Added {
		cp.entries[recepKey{e.Name, e.UUID}] = e.Path
	}
	cp.version = d.Version
	return true, false
}

// full takes piece f of a whole set; the last piece replaces the copy,
// unless the copy is newer already. It reports whether the copy changed.
// Pieces out of order (a set broken by a lost session) are dropped: the
// next digest asks again.
func (cp *recepCopy) full(f recepFull) bool {
	if f.Parts == 0 || f.Parts > recepMaxParts || f.Part >= f.Parts || len(f.Entries) > recepPiece {
		return false // malformed
	}
	if f.Part == 0 {
		cp.building, cp.buildV, cp.buildNext, cp.build = true, f.Version, 0, cp.build[:0]
	}
	if !cp.building || f.Version != cp.buildV || f.Part != cp.buildNext {
		cp.building, cp.build = false, nil
		return false
	}
	for _, e := range f.Entries {
		if !e.fits() || e.Path == "" {
			cp.building, cp.build = false, nil
			return false
		}
	}
	cp.build = append(cp.build, f.Entries...)
	cp.buildNext++
	if cp.buildNext < f.Parts {
		return false
	}
	build := cp.build
	cp.building, cp.build = false, nil
	if f.Version < cp.version {
		return false // a newer change arrived meanwhile
	}
	entries := make(map[recepKey]string, len(build))
	for _, e := range build {
		entries[recepKey{e.Name, e.UUID}] = e.Path
	}
	cp.entries, cp.version = entries, f.Version
	return true
}
