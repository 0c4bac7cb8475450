package troupe

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// A member event (which pokes every region) while Sharding is being
// called: the region is seen only once whole.
func TestAPokeWhileShardingStartsIsSafe(t *testing.T) {
	f := NewFaultNet()
	n := startOn(t, f, failConfig("alone", 20*time.Millisecond, 2*time.Second))
	c, err := StartCluster(ctxT(t, 5*time.Second), n, clusterCfg(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var stop atomic.Bool
	panicked := make(chan any, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				panicked <- p
			}
		}()
		for !stop.Load() {
			c.pokeRegions()
		}
	}()
	for i := range 200 {
		if _, err := Sharding(c, fmt.Sprint("k", i), func(string) Behavior[int] { return Behavior[int]{} }, ShardingConfig{Shards: 1}); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-panicked:
			stop.Store(true)
			t.Fatalf("pokeRegions panicked during Sharding (kind %d): %v", i, p)
		default:
		}
	}
	stop.Store(true)
}
