package troupe

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// actorTable is the node's table of its local actors: the handle at each
// path (of an actor, an adapter or an exported ask's promise), the public
// actors by name for the lookups' fast path, the restart counts that
// Stats reports, and the resolvers of the sharded kinds' entity paths.
// mu guards every field but hasKinds (atomic), live (a WaitGroup) and
// stops (a lock of its own); any goroutine may call
// its methods, and none calls out of the table under mu except a kind's
// resolver (sharding's code, never a user's).
type actorTable struct {
	mu       rwMutex[lkActors]
	byPath   map[string]*handle
	byName   map[string][]*handle // public actors by name
	restarts map[string]uint32    // by path, only of actors restarted
	// closing is set when the node stops its actors: no actor is added
	// after that.
	closing bool
	// kinds resolve the paths under a sharded kind's prefix to entity
	// handles (sharding.go); hasKinds says whether there are any, read
	// without the lock on every lookup that misses.
	kinds    map[string]func(id string) *handle
	hasKinds atomic.Bool
	// live counts the actors added and not yet terminated; Shutdown
	// waits for it.
	live sync.WaitGroup
	// stops keeps why the last actors stopped, for late watchers; it
	// has a lock of its own.
	stops recentStops
}

// add enters a new cell in the path table; anonymous if its name
// was generated.
func (t *actorTable) add(path string, h *handle, anonymous bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return ErrNodeClosed
	}
	// An anonymous actor's generated name is new under its parent (a
	// sequence number, in a name no user may give): one hash, not two.
	if !anonymous {
		if _, ok := t.byPath[path]; ok {
			return fmt.Errorf("%w: %s", ErrNameTaken, path)
		}
	}
	t.byPath[path] = h
	if isPublic(path) {
		t.byName[h.name()] = append(t.byName[h.name()], h)
	}
	t.live.Add(1)
	return nil
}

// put enters an adapter or an ask promise in the path table.
func (t *actorTable) put(path string, h *handle) {
	t.mu.Lock()
	t.byPath[path] = h
	t.mu.Unlock()
}

// remove takes the actor, adapter or promise at path out of the table.
func (t *actorTable) remove(path string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.byPath[path]
	delete(t.byPath, path)
	delete(t.restarts, path)
	if h == nil || !isPublic(path) {
		return
	}
	name := h.name()
	list := slices.DeleteFunc(t.byName[name], func(x *handle) bool { return x == h })
	if len(list) == 0 {
		delete(t.byName, name)
	} else {
		t.byName[name] = list
	}
}

// get returns the handle of the local actor at path, checking the uuid
// when one is given. nil if there is none (or another incarnation lives
// there).
func (t *actorTable) get(path string, uuid UUID) *handle {
	t.mu.RLock()
	h := t.byPath[path]
	t.mu.RUnlock()
	if h == nil && len(path) > 0 && t.hasKinds.Load() {
		h = t.entity(path) // (an entity ref has no uuid)
	}
	if h == nil || uuid != (UUID{}) && h.key.uuid != uuid {
		return nil
	}
	return h
}

// addKind makes the table resolve the paths under prefix to entity
// handles made by mk, for refs that arrive from other nodes.
func (t *actorTable) addKind(prefix string, mk func(id string) *handle) {
	t.mu.Lock()
	if t.kinds == nil {
		t.kinds = map[string]func(string) *handle{}
	}
	t.kinds[prefix] = mk
	t.hasKinds.Store(true)
	t.mu.Unlock()
}

// dropKind stops resolving the paths under prefix.
func (t *actorTable) dropKind(prefix string) {
	t.mu.Lock()
	delete(t.kinds, prefix)
	t.hasKinds.Store(len(t.kinds) > 0)
	t.mu.Unlock()
}

// entity returns the entity handle for path, if it is under a
// kind's prefix.
func (t *actorTable) entity(path string) *handle {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for prefix, mk := range t.kinds {
		if strings.HasPrefix(path, prefix) {
			return mk(path[len(prefix):])
		}
	}
	return nil
}

// named returns a public actor registered under name that accepts want,
// if there is one.
func (t *actorTable) named(name string, want reflect.Type) (*handle, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, h := range t.byName[name] {
		if h.local.protocol() == want {
			return h, true
		}
	}
	return nil, false
}

// public returns the handles of the public actors.
func (t *actorTable) public() []*handle {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []*handle
	for p, h := range t.byPath {
		if isPublic(p) {
			out = append(out, h)
		}
	}
	return out
}

// list returns every handle in the table, and a copy of the restart
// counts by path.
func (t *actorTable) list() ([]*handle, map[string]uint32) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.handles(), maps.Clone(t.restarts)
}

// close refuses every actor added from now on and returns the handles in
// the table.
func (t *actorTable) close() []*handle {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closing = true
	return t.handles()
}

// handles returns every handle in the table (mu held).
func (t *actorTable) handles() []*handle {
	out := make([]*handle, 0, len(t.byPath))
	for _, h := range t.byPath {
		out = append(out, h)
	}
	return out
}

// restarted counts a restart of the actor at path.
func (t *actorTable) restarted(path string) {
	t.mu.Lock()
	if t.restarts == nil {
		t.restarts = map[string]uint32{}
	}
	t.restarts[path]++
	t.mu.Unlock()
}
