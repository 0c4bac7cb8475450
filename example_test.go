package troupe_test

import (
	"context"
	"fmt"
	"time"

	"troupe"
)

type greet struct{ Name string }

func ExampleSpawn() {
	ctx := context.Background()
	n, err := troupe.Start(ctx, troupe.Config{})
	if err != nil {
		panic(err)
	}
	defer n.Close()

	done := make(chan struct{})
	hello, _ := troupe.Spawn(n, "hello", troupe.Behavior[greet]{
		Receive: func(c *troupe.Context[greet], m greet) {
			fmt.Printf("%s says hello to %s\n", c.Self().Path(), m.Name)
			close(done)
		},
	})
	hello.Tell(greet{Name: "gopher"})
	<-done
	// Output: /user/hello says hello to gopher
}

func ExampleAsk() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, _ := troupe.Start(ctx, troupe.Config{})
	defer n.Close()

	type question struct {
		N       int
		ReplyTo troupe.Ref[int]
	}
	doubler, _ := troupe.Spawn(n, "doubler", troupe.Behavior[question]{
		Receive: func(_ *troupe.Context[question], q question) { q.ReplyTo.Tell(2 * q.N) },
	})
	answer, err := troupe.Ask(ctx, doubler, func(r troupe.Ref[int]) question { return question{N: 21, ReplyTo: r} })
	fmt.Println(answer, err)
	// Output: 42 <nil>
}

func ExampleContext_Watch() {
	n, _ := troupe.Start(context.Background(), troupe.Config{})
	defer n.Close()

	worker, _ := troupe.Spawn(n, "worker", troupe.Behavior[string]{
		Receive: func(c *troupe.Context[string], s string) { c.Stop() },
	})
	done := make(chan struct{})
	watching := make(chan struct{})
	troupe.Spawn(n, "supervisor", troupe.Behavior[string]{
		Setup:   func(c *troupe.Context[string]) { c.Watch(worker); close(watching) },
		Receive: func(*troupe.Context[string], string) {},
		Signal: func(_ *troupe.Context[string], s troupe.Signal) {
			if t, ok := s.(troupe.Terminated); ok {
				fmt.Printf("%s stopped (reason: %v)\n", t.Ref.Path(), t.Reason)
				close(done)
			}
		},
	})
	<-watching
	worker.Tell("finish")
	<-done
	// Output: /user/worker stopped (reason: <nil>)
}
