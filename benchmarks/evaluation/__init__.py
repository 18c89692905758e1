"""The evaluation statistics checked: interval coverage, DeLong against pROC, histogram error, federated evaluation."""
