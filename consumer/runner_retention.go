package consumer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// CheckRetention compares [Config.KeyRetention] with the retention of the
// subscribed topics (read from the broker) and with [Config.ReplayWindow],
// and returns a warning for each way a record could come back after its
// key was pruned, when it would be applied a second time: a replay window
// longer than the keys, a topic kept longer than the keys, kept forever
// (retention.ms -1), or compacted (cleanup.policy=compact, which keeps
// each key's latest record forever whatever retention.ms says); its Kind
// tells which. Run logs them at start.
func (c *Consumer) CheckRetention(ctx context.Context) ([]RetentionWarning, error) {
	var warnings []RetentionWarning
	keep := c.cfg.KeyRetention
	if c.cfg.ReplayWindow > keep {
		warnings = append(warnings, RetentionWarning{Kind: RetentionReplayWindow, Message: fmt.Sprintf("key retention %s is shorter than the dead-letter replay window %s: a replay after the key is pruned can apply an effect twice", keep, c.cfg.ReplayWindow)})
	}
	topics := c.client.GetConsumeTopics()
	if len(topics) == 0 {
		return warnings, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	configs, err := kadm.NewClient(c.client).DescribeTopicConfigs(cctx, topics...)
	if err != nil {
		return warnings, fmt.Errorf("describe topic configs: %w", err)
	}
	for _, rc := range configs {
		if rc.Err != nil {
			return warnings, fmt.Errorf("describe topic %s: %w", rc.Name, rc.Err)
		}
		var retention, policy *string
		for _, cfg := range rc.Configs {
			switch cfg.Key {
			case "retention.ms":
				retention = cfg.Value
			case "cleanup.policy":
				policy = cfg.Value
			}
		}
		if policy != nil && compactOnly(*policy) {
			// retention.ms does not apply: each key's latest record stays
			// for as long as the topic does.
			warnings = append(warnings, RetentionWarning{Kind: RetentionTopicCompacted, Topic: rc.Name, Message: fmt.Sprintf("topic %s is compacted (cleanup.policy=%s): it keeps each key's latest record forever, but processed keys are kept %s: a reset to an old offset, or a new consumer group reading from the start, applies those records' effects again", rc.Name, *policy, keep)})
			continue
		}
		if retention == nil {
			continue
		}
		ms, err := strconv.ParseInt(*retention, 10, 64)
		if err != nil {
			continue
		}
		switch {
		case ms < 0:
			warnings = append(warnings, RetentionWarning{Kind: RetentionTopicForever, Topic: rc.Name,
				Message: fmt.Sprintf("topic %s keeps records forever but processed keys are kept %s: a reset to an old offset applies effects again", rc.Name, keep)})
		case time.Duration(ms)*time.Millisecond > keep:
			warnings = append(warnings, RetentionWarning{Kind: RetentionTopicLonger, Topic: rc.Name,
				Message: fmt.Sprintf("key retention %s is shorter than topic %s's retention %s: a redelivery after the key is pruned applies its effect again", keep, rc.Name, time.Duration(ms)*time.Millisecond)})
		}
	}
	return warnings, nil
}

// compactOnly reports whether a cleanup.policy value compacts without
// deleting by time ("compact", not "compact,delete").
func compactOnly(policy string) bool {
	compact, del := false, false
	for _, p := range strings.Split(policy, ",") {
		switch strings.TrimSpace(p) {
		case "compact":
			compact = true
		case "delete":
			del = true
		}
	}
	return compact && !del
}
