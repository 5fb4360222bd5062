package intake

import (
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err == nil || !strings.Contains(err.Error(), "Tasks store is required") {
		t.Errorf("Validate() = %v, want Tasks required", err)
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New accepted a config without a Tasks store")
	}
	c := Config{}.withDefaults()
	if c.Log == nil || c.Now == nil {
		t.Errorf("defaults not filled: %+v", c)
	}
}
