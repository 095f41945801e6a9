"""CDS Hooks decisions: the services ebmrag offers an EHR, a hook request read and checked, and the cards a chart
gives (an allergy of the ordered drug's class, renal function for a renally cleared drug, a current pregnancy,
critical results of the last hours).

`hooks` (services, requests, `hook_cards`), `facts` (what a card may cite: the chart reader's `ChartFacts` plus the
drug vocabulary's identities and ebmrag's critical limits), `cards` (the cards' wording), `fetch` (a missing
prefetch read from the EHR's FHIR server through `ehr.fhir`), `params` ([cds]). Apart from `ehr/`, which pulls
charts into the store: a decision reads one chart as the hook gives it and stores nothing. The HTTP routes are
serve.cds_routes.
"""
