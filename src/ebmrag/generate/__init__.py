"""From packed context to a checked answer: the prompt budget, evidence assembly, numbering for citation, the staged
model answer or the offline brief, the grounding check, redaction and the fence around context sent to a model."""
