package asynqroom

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// The fleet's capacity (lua/capacity.lua): each sluice worker registers how
// many jobs of each queue it runs at once and renews that while it lives;
// a queue's capacity is then one counter, which a gauge reads with one
// command, whatever the fleet's size. asynq's own server registry holds
// every server's running tasks: reading it from every producer and pump
// every few seconds costs Redis the fleet's size squared. The registry
// lives beside asynq's queues (it describes the servers that serve them),
// under a name of its own.

// Keys of the fleet's registry, one hash tag.
const (
	fleetWorkersKey  = "sluice-fleet:{fleet}:workers"
	fleetCapacityKey = "sluice-fleet:{fleet}:capacity"
)

// Defaults of a registration.
const (
	// RegistrationLapse is how long a worker's registration outlives its
	// last renewal: a worker that dies stops counting after it.
	RegistrationLapse = 15 * time.Second
	// registrationEvery is how often a worker renews its registration.
	registrationEvery = RegistrationLapse / 3
)

// Registration is one worker's entry in the fleet's capacity: its
// concurrency, counted for each queue it serves. Register starts it.
type Registration struct {
	client  redis.UniversalClient
	members []any
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	onError func(error)
}

// Register counts a worker that runs concurrency jobs at once from queues
// in the fleet's capacity, and renews the registration every few seconds
// until Close. onError, when set, is told of a renewal that failed (the
// next one tries again; after RegistrationLapse the worker stops counting).
func Register(ctx context.Context, client redis.UniversalClient, queues []string, concurrency int, onError func(error)) (*Registration, error) {
	host, _ := os.Hostname()
	id := host + ":" + strconv.Itoa(os.Getpid()) + ":" + uuid.NewString()
	r := &Registration{client: client, stop: make(chan struct{}), done: make(chan struct{}), onError: onError}
	for _, q := range queues {
		r.members = append(r.members, id+"\x1f"+q+"\x1f"+strconv.Itoa(concurrency))
	}
	if err := r.join(ctx); err != nil {
		return nil, err
	}
	go r.renew()
	return r, nil
}

func (r *Registration) join(ctx context.Context) error {
	args := append([]any{"join", RegistrationLapse.Milliseconds()}, r.members...)
	if err := lua.Capacity.Run(ctx, r.client, []string{fleetWorkersKey, fleetCapacityKey}, args...).Err(); err != nil {
		return fmt.Errorf("register the worker's capacity: %w", err)
	}
	return nil
}

func (r *Registration) renew() {
	defer close(r.done)
	t := time.NewTicker(registrationEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), registrationEvery)
		if err := r.join(ctx); err != nil && r.onError != nil {
			r.onError(err)
		}
		cancel()
	}
}

// Close stops counting the worker: its registration is removed.
func (r *Registration) Close(ctx context.Context) error {
	var err error
	r.once.Do(func() {
		close(r.stop)
		<-r.done
		args := append([]any{"leave"}, r.members...)
		if e := lua.Capacity.Run(ctx, r.client, []string{fleetWorkersKey, fleetCapacityKey}, args...).Err(); e != nil {
			err = fmt.Errorf("deregister the worker's capacity: %w", e)
		}
	})
	return err
}

// registeredCapacity is how many jobs of queue the registered workers run
// at once (lapsed registrations are dropped first).
func registeredCapacity(ctx context.Context, client redis.UniversalClient, queue string) (int, error) {
	res, err := lua.Capacity.Run(ctx, client, []string{fleetWorkersKey, fleetCapacityKey}, "read", queue).Result()
	if err != nil {
		return 0, fmt.Errorf("read the fleet's capacity: %w", err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 1 {
		return 0, fmt.Errorf("capacity.lua: unexpected reply %v", res)
	}
	n, ok := arr[0].(int64)
	if !ok {
		return 0, fmt.Errorf("capacity.lua: unexpected reply %v", res)
	}
	return int(n), nil
}
