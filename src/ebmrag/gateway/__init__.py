"""The results gateway: specialist-model and laboratory results from a message queue into the patient store."""
