// Command rolling_restart is a deploy: three service processes each host
// an actor named "echo", a client sends a steady stream of Asks to
// whichever one the registry returns, and each service process in turn
// gets SIGTERM (what Kubernetes sends) and is replaced by a new one.
//
// Each service ends through troupe.ShutdownOnSignal: its names leave the
// registry first, then it stops accepting connections, finishes the
// request in hand (its reply still goes out), and says goodbye. A request
// that reached it too late fails at once (its Ask hears the actor stop)
// and the client retries it on another service. No request is lost; the
// example prints how many attempts failed and what the deploy cost in
// latency.
//
// Run it with: go run ./examples/rolling_restart
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"troupe"
)

// Echo asks a service to answer N.
type Echo struct {
	N       int
	ReplyTo troupe.Ref[Reply]
}

// Reply is a service's answer.
type Reply struct {
	N       int
	Service string
}

func init() {
	troupe.SetWireKey[Echo]("rolling_restart.echo")
	troupe.SetWireKey[Reply]("rolling_restart.reply")
}

// serviceEnv, when set, makes this program a service process registering
// with the registry it names; slotEnv says which of the three it is.
const (
	serviceEnv = "ROLLING_RESTART_REGISTRY"
	slotEnv    = "ROLLING_RESTART_SLOT"
)

// slots is how many service processes run.
const slots = 3

// serviceName is the name slot's actor registers under (a registrar holds
// one actor per name).
func serviceName(slot int) string { return fmt.Sprintf("echo-%d", slot) }

func main() {
	if registry := os.Getenv(serviceEnv); registry != "" {
		slot, _ := strconv.Atoi(os.Getenv(slotEnv))
		if err := service(registry, slot); err != nil {
			log.Fatal(err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	res, err := run(ctx, exe, nil)
	if err != nil {
		log.Fatal(err)
	}
	res.print(os.Stdout)
}

// service runs one service process: an "echo-SLOT" actor, registered,
// until SIGTERM, then a graceful shutdown. It prints READY once it runs.
func service(registry string, slot int) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := troupe.Start(context.Background(), troupe.Config{Name: fmt.Sprintf("service-%d", os.Getpid()), RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		return err
	}
	name := n.Name()
	if _, err := troupe.Spawn(n, serviceName(slot), troupe.Behavior[Echo]{Receive: func(_ *troupe.Context[Echo], e Echo) {
		time.Sleep(time.Millisecond) // a little work
		e.ReplyTo.Tell(Reply{N: e.N, Service: name})
	}}); err != nil {
		n.Close()
		return err
	}
	fmt.Println("READY")
	return n.ShutdownOnSignal(10 * time.Second)
}

// result is what the client saw during the deploy.
type result struct {
	Requests int           // requests the client made, each answered in the end
	Failed   int           // Asks that failed (the service stopped under them) and were retried
	Moved    int           // attempts that found their service unregistered and went to the next
	Lost     int           // requests that never got an answer
	Restarts int           // service processes replaced
	P50      time.Duration // latency of a request, retries included
	P99      time.Duration
	Max      time.Duration
	Services int // distinct service processes that answered
}

func (r result) print(w io.Writer) {
	fmt.Fprintf(w, "%d requests during %d restarts: %d lost; %d Asks failed and were retried, %d went to the next service while one restarted\n",
		r.Requests, r.Restarts, r.Lost, r.Failed, r.Moved)
	fmt.Fprintf(w, "latency: p50 %v, p99 %v, max %v; answered by %d service processes\n",
		r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.Max.Round(time.Millisecond), r.Services)
}

// proc is a running service process.
type proc struct {
	cmd  *exec.Cmd
	done chan error
}

func startService(exe, registry string, slot int, args []string) (*proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), serviceEnv+"="+registry, fmt.Sprintf("%s=%d", slotEnv, slot))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		said := false
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "READY" && !said {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
		p.done <- cmd.Wait()
	}()
	select {
	case ok := <-ready:
		if !ok {
			return nil, errors.New("a service process ended before it was ready")
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return nil, errors.New("a service process was not ready within 30 s")
	}
	return p, nil
}

// run starts a registrar and three services (exe with args, in service
// mode), runs the client, replaces each service in turn, and reports.
func run(ctx context.Context, exe string, args []string) (result, error) {
	var res result
	dir, err := os.MkdirTemp("", "troupe-rr")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	registry := "unix://" + filepath.Join(dir, "registry.sock")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := troupe.Start(ctx, troupe.Config{Name: "registrar", RegistryAddrs: []string{registry}, EnsureRegistry: true, Logger: quiet})
	if err != nil {
		return res, err
	}
	defer reg.Close()

	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
		}
	}()
	for slot := range slots {
		p, err := startService(exe, registry, slot, args)
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
	}
	client, err := troupe.Start(ctx, troupe.Config{Name: "client", RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		return res, err
	}
	defer client.Close()
	// waitService waits until slot's actor is registered.
	waitService := func(slot int) error {
		for ctx.Err() == nil {
			if _, err := troupe.FindActor[Echo](ctx, client, serviceName(slot)); err == nil {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		return ctx.Err()
	}
	for slot := range slots {
		if err := waitService(slot); err != nil {
			return res, err
		}
	}

	// The client: one request at a time, each retried until answered.
	stop := make(chan struct{})
	clientDone := make(chan error, 1)
	var latencies []time.Duration
	var smu sync.Mutex
	services := map[string]bool{}
	answered := func() int { smu.Lock(); defer smu.Unlock(); return len(services) }
	go func() {
		refs := map[int]troupe.Ref[Echo]{}
		for n := 0; ; n++ {
			select {
			case <-stop:
				clientDone <- nil
				return
			default:
			}
			begin := time.Now()
			for attempt := 0; ; attempt++ {
				if attempt == 50 || ctx.Err() != nil {
					res.Lost++
					break
				}
				slot := (n + attempt) % slots // a retry goes to the next service
				ref, ok := refs[slot]
				if !ok {
					var err error
					ref, err = troupe.FindActor[Echo](ctx, client, serviceName(slot))
					if err != nil {
						res.Moved++
						time.Sleep(5 * time.Millisecond)
						continue
					}
					refs[slot] = ref
				}
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				rep, err := troupe.Ask(actx, ref, func(r troupe.Ref[Reply]) Echo { return Echo{N: n, ReplyTo: r} })
				cancel()
				if err == nil && rep.N == n {
					smu.Lock()
					services[rep.Service] = true
					smu.Unlock()
					break
				}
				res.Failed++
				delete(refs, slot) // look it up again
			}
			res.Requests++
			latencies = append(latencies, time.Since(begin))
		}
	}()

	// abort stops the client before the result is read: it writes it.
	abort := func(err error) (result, error) {
		close(stop)
		<-clientDone
		return res, err
	}

	// The deploy: each service in turn gets SIGTERM, exits, and is
	// replaced by a new process, which registers before the next goes.
	time.Sleep(300 * time.Millisecond)
	for i := range procs {
		procs[i].cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-procs[i].done:
		case <-time.After(20 * time.Second):
			return abort(errors.New("a service did not exit within 20 s of SIGTERM"))
		}
		p, err := startService(exe, registry, i, args)
		if err != nil {
			return abort(err)
		}
		procs[i] = p
		res.Restarts++
		if err := waitService(i); err != nil {
			return abort(err)
		}
		// The new process takes requests before the next one goes: the
		// three old and this new one have answered.
		for deadline := time.Now().Add(20 * time.Second); answered() < slots+i+1; {
			if time.Now().After(deadline) {
				return abort(fmt.Errorf("the new service %d answered nothing within 20 s", i))
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
	}
	close(stop)
	if err := <-clientDone; err != nil {
		return res, err
	}
	for _, p := range procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
	}
	procs = nil
	slices.Sort(latencies)
	if len(latencies) > 0 {
		res.P50 = latencies[len(latencies)/2]
		res.P99 = latencies[len(latencies)*99/100]
		res.Max = latencies[len(latencies)-1]
	}
	res.Services = answered()
	return res, nil
}
