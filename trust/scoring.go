package trust

// The scoring — policy, score, stats, the window of outcomes — is pure and
// lives in the core (internal/core/scoring); this package keeps the stores
// and the view that read and write NATS, and names the pure parts here so
// that a caller needs one import.

import "github.com/dispatchmesh/dispatchmesh/internal/core/scoring"

type (
	Backlog    = scoring.Backlog
	Canary     = scoring.Canary
	GateMark   = scoring.GateMark
	Outcome    = scoring.Outcome
	Policy     = scoring.Policy
	Pool       = scoring.Pool
	Prior      = scoring.Prior
	Spend      = scoring.Spend
	Stats      = scoring.Stats
	TaskResult = scoring.TaskResult
	Verdict    = scoring.Verdict
)

const (
	BacklogStop           = scoring.BacklogStop
	DefaultCanary         = scoring.DefaultCanary
	DefaultCanaryTTL      = scoring.DefaultCanaryTTL
	DefaultDecay          = scoring.DefaultDecay
	DefaultHoldTime       = scoring.DefaultHoldTime
	DefaultMinOutcomes    = scoring.DefaultMinOutcomes
	DefaultOverallWeight  = scoring.DefaultOverallWeight
	DefaultProbeAfter     = scoring.DefaultProbeAfter
	DefaultProbeInterval  = scoring.DefaultProbeInterval
	DefaultRecencyWeight  = scoring.DefaultRecencyWeight
	DefaultRunAlpha       = scoring.DefaultRunAlpha
	DefaultRungExplore    = scoring.DefaultRungExplore
	DefaultRungFloor      = scoring.DefaultRungFloor
	DefaultRungMinSamples = scoring.DefaultRungMinSamples
	DefaultThreshold      = scoring.DefaultThreshold
	DefaultWindow         = scoring.DefaultWindow
	GateMemory            = scoring.GateMemory
	Keep                  = scoring.Keep
	MaxPriorWeight        = scoring.MaxPriorWeight
	MaxProbeInterval      = scoring.MaxProbeInterval
	MaxWindow             = scoring.MaxWindow
	MinPriorWeight        = scoring.MinPriorWeight
	PoolMinTasks          = scoring.PoolMinTasks
	PoolMinTypes          = scoring.PoolMinTypes
)

var (
	Day           = scoring.Day
	DefaultExempt = scoring.DefaultExempt
	EndMarker     = scoring.EndMarker
	Insert        = scoring.Insert
	NewPool       = scoring.NewPool
	Release       = scoring.Release
	ReleaseBefore = scoring.ReleaseBefore
	Score         = scoring.Score
	StreakStep    = scoring.StreakStep
	Tasks         = scoring.Tasks
)
