"""The texts the int8 variant's activation ranges are calibrated on.

Written for this project (no corpus is copied): search queries, sentences and passages of
many lengths, several languages and scripts, code, numbers, markup and emoji, so that every
quantized MatMul sees the spread of activations real traffic brings. They are tokenized with
the artifact's own tokenizer, one text per forward, so padding never enters a range.
"""

from __future__ import annotations

_QUERIES = (
    "how do vaccines train the immune system",
    "cheap flights lisbon to montreal in march",
    "what is the boiling point of water at altitude",
    "python sort dictionary by value",
    "best hiking trails near the lake district",
    "symptoms of iron deficiency in adults",
    "who painted the ceiling of the sistine chapel",
    "convert 72 fahrenheit to celsius",
    "wie funktioniert eine wärmepumpe",
    "recette de la tarte aux pommes facile",
    "cómo cambiar la batería de un reloj",
    "東京 おすすめ ラーメン",
    "如何学习机器学习",
    "ok",
    "hi there",
    "refund policy?",
    "error 404",
    "k8s pod crashloopbackoff",
)

_SENTENCES = (
    "The bakery on the corner opens at six, and by seven the queue reaches the bus stop.",
    "Our quarterly revenue grew 14% year over year, driven mostly by subscription renewals.",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "Please restart the router, wait thirty seconds, and then try connecting again.",
    "The committee postponed the vote until the environmental report is published.",
    "She tuned the old violin carefully before the evening rehearsal in the chapel.",
    "A binary search halves the remaining interval at every step, so it runs in log time.",
    "I ordered the blue jacket in size M but received a red one in size XL.",
    "The river flooded twice this spring; the farmers lost most of their early crops.",
    "Der Zug nach Hamburg hat heute wegen eines Signalfehlers vierzig Minuten Verspätung.",
    "Le musée sera fermé lundi prochain pour l'installation d'une nouvelle exposition.",
    "La reunión de vecinos se celebrará el jueves a las ocho en el salón del edificio.",
    "Il treno regionale per Firenze parte dal binario sette alle nove e un quarto.",
    "Новая библиотека откроется в центре города в начале следующего года.",
    "明日の会議は午後三時から第二会議室で行われます。",
    "这家餐厅的饺子非常好吃，价格也很合理。",  # noqa: RUF001 (Chinese punctuation)
    "서울의 지하철은 깨끗하고 편리해서 관광객들에게 인기가 많다.",
    "يبدأ العام الدراسي الجديد في الأسبوع الأول من سبتمبر.",
    "Loved it!!! 😍🔥 would totally buy again 👍👍",
    "ERROR 2024-05-17T09:12:44Z worker-3 timeout after 30000 ms (retry 2/5)",
    "SELECT name, COUNT(*) FROM orders WHERE status = 'shipped' GROUP BY name;",
    "def mean(xs): return sum(xs) / len(xs) if xs else 0.0",
    "<div class=\"card\"><h2>Title</h2><p>Body text goes here.</p></div>",
    "Call +1 (555) 013-2487 or email support@example.org before 5:30 pm EST.",
    "x = 3.14159, y = 2.71828, z = x * y ≈ 8.5397",
    "   spaces before and after   ",
    "ALL CAPS HEADLINE: LOCAL TEAM WINS CHAMPIONSHIP AFTER 40 YEARS",
)

_PASSAGES = (
    "Caring for a sourdough starter is mostly a matter of routine. Feed it equal weights of "
    "flour and water once a day if it lives on the counter, or once a week if it sleeps in "
    "the fridge. A healthy starter doubles within a few hours of feeding, smells pleasantly "
    "sour, and is full of small bubbles. If a grey liquid collects on top, the starter is "
    "hungry: pour it off, discard half, and feed it again. Rye flour speeds things up, while "
    "a cooler kitchen slows fermentation and gives a milder, more yoghurt-like flavour.",
    "When a request reaches the load balancer, it is routed to the least busy replica. The "
    "replica checks the cache first; on a miss it queries the primary database, serializes "
    "the result and stores it with a five minute expiry. Writes always go to the primary and "
    "are replicated asynchronously, which means a client that reads immediately after "
    "writing may briefly see stale data. To avoid that, the session pins reads to the "
    "primary for a few seconds after each write. Metrics for every step are exported to the "
    "monitoring system, and an alert fires when the 99th percentile latency exceeds 250 ms.",
    "The lighthouse stood on a rock a mile from the shore, and for ninety years a keeper "
    "climbed its spiral stairs every evening to light the lamp. Storms were the hardest part "
    "of the job: waves broke over the gallery, salt crusted the glass, and supplies could "
    "not be landed for weeks. When the light was automated the last keeper moved to the "
    "village, but he still walked to the harbour each night to watch the beam sweep across "
    "the water, counting the seconds between flashes out of habit.",
    "Die Energiewende verlangt mehr als neue Windräder und Solaranlagen. Stromnetze müssen "
    "ausgebaut werden, damit der Strom aus dem windreichen Norden in die Industriezentren im "
    "Süden gelangt, und Speicher müssen die Schwankungen zwischen Tag und Nacht ausgleichen. "
    "Gleichzeitig sollen Gebäude effizienter werden, denn ein großer Teil der Energie wird "
    "für Heizung und Warmwasser verbraucht.",
    "Les abeilles jouent un rôle essentiel dans la pollinisation de nombreuses cultures. "
    "Leur déclin, observé dans plusieurs régions du monde, inquiète les agriculteurs comme "
    "les scientifiques. Les causes sont multiples : pesticides, parasites, perte d'habitat "
    "et changement climatique. Des programmes locaux encouragent désormais la plantation de "
    "fleurs sauvages le long des routes et dans les jardins.",
    "Terms of service, section 4.2: The subscriber may cancel at any time by written notice. "
    "Fees already paid for the current billing period are not refundable, except where "
    "required by applicable law. The provider may suspend access if payment is more than "
    "thirty (30) days overdue, after giving at least seven (7) days' notice by email to the "
    "address on file. Suspension does not relieve the subscriber of the obligation to pay.",
    "import numpy as np\n\n"
    "def cosine(a: np.ndarray, b: np.ndarray) -> float:\n"
    "    \"\"\"Cosine similarity of two vectors.\"\"\"\n"
    "    na, nb = np.linalg.norm(a), np.linalg.norm(b)\n"
    "    if na == 0 or nb == 0:\n"
    "        return 0.0\n"
    "    return float(a @ b / (na * nb))\n\n"
    "for i, (x, y) in enumerate(zip(left, right)):\n"
    "    print(i, round(cosine(x, y), 4))\n",
)


def calibration_texts() -> list[str]:
    """Every calibration text, plus two long ones built from the passages so that the
    ranges cover inputs near a model's full length as well."""
    long_english = " ".join(_PASSAGES[:3])
    very_long = " ".join((*_PASSAGES, *_SENTENCES))
    return [*_QUERIES, *_SENTENCES, *_PASSAGES, long_english, very_long]


# Inputs far from prose, on which activations leave the ranges prose gives: attention spread
# over one repeated token averages nothing away, so its output reaches the value vectors' full
# range (all-MiniLM-L6-v2, a word repeated to 256 tokens: attention outputs 1.2-3.4x past the
# prose range, 12% of one layer's clipped, cosine 0.928 against fp32).
_STRESS = ("data ", "- ", "0 ", "@")


def stress_texts() -> list[str]:
    """Repetitions (cut to the model's length by the tokenizer) and a lone symbol: what the
    int8 ranges are checked against beside the calibration texts (quantize.calibrate)."""
    return [word * 400 if word.endswith(" ") else word for word in _STRESS]
