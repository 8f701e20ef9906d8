package worker

import (
	"context"
	"errors"
	"github.com/sluicehq/sluice/internal/waitroom"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/asynqroom"
)

// The worker's part in the waiting room (waitroom.Room): the pump that
// moves waiting jobs to asynq when they may start and the fleet has room,
// and its metrics. A finished job's slot is handed to the next in its
// tenant's line by the gate's release (gate.go).

// roomMetrics are the waiting room's Prometheus metrics.
type roomMetrics struct {
	tenants  bool
	promoted prometheus.Counter
	skipped  *prometheus.CounterVec
	waiting  *prometheus.GaugeVec
	oldest   *prometheus.GaugeVec
}

func newRoomMetrics(reg prometheus.Registerer, tenants bool) (*roomMetrics, error) {
	var labels []string
	if tenants {
		labels = []string{"tenant"}
	}
	m := &roomMetrics{
		tenants: tenants,
		promoted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_room_promoted_total",
			Help: "Jobs this worker moved from their tenants' lines in the waiting room to asynq's pending list (by its pump, or handing a finished job's slot on).",
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_room_skipped_total",
			Help: "Line entries dropped because their job was gone from asynq (deleted, archived, completed) or was running already.",
		}, []string{"reason"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_room_waiting",
			Help: "Jobs waiting in their tenants' lines, as last sampled (every 5s) by the one worker of the fleet that reports them (the holder of the recoverer's lock).",
		}, labels),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_room_oldest_wait_seconds",
			Help: "How long the job at the head of a line has waited (the longest of all tenants without tenant labels), last sampled.",
		}, labels),
	}
	for _, c := range []prometheus.Collector{m.promoted, m.skipped, m.waiting, m.oldest} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// handOn hands to asynq the job a release promoted into the slot it freed,
// and counts it in the room's metrics as the pump's turns count theirs.
func (g *Gate) handOn(ctx context.Context, jobs []waitroom.Promoted) []waitroom.HandoverResult {
	res := g.handover(ctx, jobs)
	for _, r := range res {
		switch r {
		case waitroom.Handed, waitroom.Confirmed:
			g.rm.promoted.Inc()
		case waitroom.Gone:
			g.rm.skipped.WithLabelValues("gone").Inc()
		}
	}
	return res
}

// handing is the hand-over of jobs a release promotes: none while the
// room is off.
func (g *Gate) handing() waitroom.Handover {
	if g.roomOff.Load() {
		return nil
	}
	return g.handOn
}

const errLayout = "asynq_layout"

// layoutOK checks, before the pump runs, that asynq's version and the
// layout of its keys are the ones the room writes (asynqroom.Layout: the
// build info and a probe). On an unknown one the room is off for good:
// said once in the log (ERROR) and counted
// (sluice_worker_errors_total{kind="asynq_layout"}); the pump does not run,
// releases hand nothing on, and jobs reach the workers as jobs from
// asynq's own client do, decided by the gate. A check that cannot be made
// (Redis) is tried again every second, until ctx ends.
func (g *Gate) layoutOK(ctx context.Context) bool {
	for {
		cctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
		err := g.layout.Check(cctx)
		cancel()
		var le *asynqroom.LayoutError
		switch {
		case err == nil:
			return true
		case errors.As(err, &le):
			g.roomOff.Store(true)
			g.m.err(errLayout)
			g.log.Error("waiting room is off", "err", le)
			return false
		case ctx.Err() != nil:
			return false
		}
		g.m.err(errRoom)
		g.warn(errRoom, "cannot check asynq layout; retrying", "err", err)
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// sampleEvery is how often the pump samples the lines for the metrics.
const sampleEvery = 5 * time.Second

// startPump runs the waiting room's pump for queues (see
// waitroom.Room.Pump) until Stop: it moves jobs that producers
// (queue.Client) parked in their tenants' lines to asynq's pending lists,
// when they may start and the fleet serving queues has room for them. A
// gate runs one pump; later calls do nothing.
func (g *Gate) startPump(queues []string, concurrency int) {
	g.blockSlots.Store(int64(concurrency))
	g.pumpOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		// the fleet's capacity counts this worker while it lives
		reg, err := asynqroom.Register(ctx, g.asynqRedis, queues, concurrency, func(err error) {
			g.m.err(errRoom)
			g.warn(errRoom, "cannot renew fleet capacity registration", "err", err)
		})
		if err != nil {
			g.m.err(errRoom)
			g.log.Error("cannot register in fleet capacity", "err", err)
		}
		g.registration = reg
		g.pumpWG.Add(2)
		go func() {
			defer g.pumpWG.Done()
			g.sampleLines(ctx, queues)
		}()
		go func() {
			defer g.pumpWG.Done()
			if !g.layoutOK(ctx) {
				return
			}
			_ = g.room.Pump(ctx, &waitroom.PumpConfig{
				Queues:   queues,
				Handover: g.handover,
				Engine:   g.engine,
				Tasks:    asynqroom.Tasks(g.inspector),
				Repark:   asynqroom.Repark(g.asynqRedis),
				Free: func(ctx context.Context, queue string) (int, error) {
					return g.gauge.Free(ctx, []string{queue})
				},
				// the fleet's lock holder polls the index; the others sleep
				// longer, woken by the wake channel
				Quiet: g.rec.follower,
				Kick:  g.kick,
				Drain: g.gauge.Drain,
				OnTurn: func(_ string, t waitroom.Turn, handed, gone int) {
					g.rm.promoted.Add(float64(handed))
					g.rm.skipped.WithLabelValues("gone").Add(float64(gone))
					g.rm.skipped.WithLabelValues("running").Add(float64(t.Skipped))
				},
				OnError: func(err error) {
					g.m.err(errRoom)
					g.warn(errRoom, "pump error", "err", err)
				},
			})
		}()
		g.stopPump = cancel
	})
}

// sampleLines keeps the waiting metrics of the lines of the fleet's queues
// (of queues, without a recoverer), every sampleEvery, while this worker
// holds the fleet's lock: one worker of a fleet reports them, so that idle
// workers do not each read every line, and a sum across workers is the
// fleet's.
func (g *Gate) sampleLines(ctx context.Context, queues []string) {
	every(ctx, sampleEvery, func() {
		if g.rec.follower() {
			g.rm.waiting.Reset()
			g.rm.oldest.Reset()
			return
		}
		sampled := queues
		if g.rec != nil && g.rec.on.Load() {
			// the lock holder reports every queue of the fleet
			sampled, _ = g.rec.fleetQueues(ctx)
		}
		lines, err := g.room.Lines(ctx, sampled...)
		if err != nil {
			if ctx.Err() == nil {
				g.m.err(errRoom)
				g.warn(errRoom, "cannot sample waiting lines", "err", err)
			}
			return
		}
		now := time.Now()
		waiting := map[string]int64{}
		oldest := map[string]time.Duration{}
		for _, l := range lines {
			key := ""
			if g.rm.tenants {
				key = l.Tenant
			}
			waiting[key] += l.Waiting
			oldest[key] = max(oldest[key], now.Sub(l.Oldest))
		}
		g.rm.waiting.Reset()
		g.rm.oldest.Reset()
		if !g.rm.tenants {
			g.rm.waiting.WithLabelValues().Set(float64(waiting[""]))
			g.rm.oldest.WithLabelValues().Set(oldest[""].Seconds())
			return
		}
		for t, n := range waiting {
			g.rm.waiting.WithLabelValues(t).Set(float64(n))
			g.rm.oldest.WithLabelValues(t).Set(oldest[t].Seconds())
		}
	})
}
