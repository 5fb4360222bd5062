package executor

import "testing"

func TestReadUsage(t *testing.T) {
	tests := []struct {
		stdout string
		want   usage
	}{
		{`{"status":"success","approach":"a","model":"m","tokens_in":7,"tokens_out":3,"cost":0.01}`, usage{Model: "m", TokensIn: 7, TokensOut: 3, Cost: 0.01}},
		{"log line\n" + `{"status":"success","approach":"a"}`, usage{}},
		{`{"tokens_in":"many"}`, usage{}},
		{`{"tokens_in":-5}`, usage{}},
		{"no json", usage{}},
	}
	for _, tt := range tests {
		if got := readUsage(tt.stdout); got != tt.want {
			t.Errorf("readUsage(%q) = %+v, want %+v", tt.stdout, got, tt.want)
		}
	}
}

func FuzzReadUsage(f *testing.F) {
	for _, s := range []string{`{"tokens_in":7,"tokens_out":3,"cost":0.5,"model":"m"}`, "}{", "", `{"cost":-1}`, `{"tokens_in":1e30}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, stdout string) {
		u := readUsage(stdout)
		if u.TokensIn < 0 || u.TokensOut < 0 || u.Cost < 0 {
			t.Fatalf("negative usage accepted: %+v", u)
		}
	})
}
