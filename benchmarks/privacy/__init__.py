"""Differential privacy: what leaves a client, the accountant's cost, utility against epsilon, validation under DP."""
