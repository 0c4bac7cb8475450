package troupe

import (
	"errors"
	"fmt"
)

// The watches a peer's actors place on this node's actors, and their
// bounds: what one peer may make this node hold for them.

// ErrWatchRefused is the reason of the [Terminated] a watcher gets when a
// watch of an actor on another node could not be placed: the watched node
// already holds [Config.MaxWatchesPerPeer] watches (or 16 MiB of watcher
// paths) for the watcher's node, or the watcher's path is longer than
// 1 KiB. The watched actor may well be running: this is no stop. It is
// also wrapped by the error of a [Registry.Watch] the registrar refused
// (it has 1,024 subscribers already). The text says which bound was met.
var ErrWatchRefused = errors.New("troupe: watch refused")

const (
	// maxWatchPath bounds the path of a watcher on another node: a watch
	// frame with a longer one is malformed (this node refuses such a
	// watch locally, before it is sent).
	maxWatchPath = 1 << 10
	// maxWatchBytes bounds the bytes of watcher paths that one peer's
	// watches make this node hold, whatever their count.
	maxWatchBytes = 16 << 20
)

// watchSet is the set of watches one peer's actors placed on this
// node's actors (guarded by the association's mu), with the bytes of
// their watcher paths.
type watchSet struct {
	m     map[inWatch]*handle
	bytes int
}

// add records w, of the local actor target; false when w is new and the
// set is full.
func (s *watchSet) add(w inWatch, target *handle, limit int) bool {
	if _, ok := s.m[w]; ok {
		s.m[w] = target
		return true
	}
	if len(s.m) >= limit || s.bytes+len(w.watcher) > maxWatchBytes {
		return false
	}
	if s.m == nil {
		s.m = make(map[inWatch]*handle)
	}
	s.m[w] = target
	s.bytes += len(w.watcher)
	return true
}

func (s *watchSet) remove(w inWatch) {
	if _, ok := s.m[w]; ok {
		delete(s.m, w)
		s.bytes -= len(w.watcher)
	}
}

// take empties s and returns what it held.
func (s *watchSet) take() map[inWatch]*handle {
	m := s.m
	*s = watchSet{}
	return m
}

// merge adds the watches of m, which another session of the same peer
// held: they were admitted there, so no bound refuses them here.
func (s *watchSet) merge(m map[inWatch]*handle) {
	for w, target := range m {
		if _, ok := s.m[w]; !ok {
			s.bytes += len(w.watcher)
		}
		if s.m == nil {
			s.m = make(map[inWatch]*handle)
		}
		s.m[w] = target
	}
}

// refusal says why a watch of the peer's is refused, or nil.
func (s *watchSet) refusal(limit int) error {
	switch {
	case len(s.m) >= limit:
		return fmt.Errorf("%w: the watched node holds %d watches for this node (Config.MaxWatchesPerPeer)", ErrWatchRefused, len(s.m))
	default:
		return fmt.Errorf("%w: the watched node holds %d bytes of watcher paths for this node (at most %d)", ErrWatchRefused, s.bytes, maxWatchBytes)
	}
}
