package executor

// CircuitSeen is the state of the circuit of model at endpoint as this
// instance last saw it (from the bucket's watcher, or its memory).
func (s *Service) CircuitSeen(endpoint, model string) int {
	data, rev := s.models.store.get(stateKey("circuit", endpoint, model))
	if rev == 0 {
		return CircuitClosed
	}
	c, err := decodeCircuit(data)
	if err != nil {
		return -1
	}
	return c.State
}
