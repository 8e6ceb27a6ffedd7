// Writes tests/unit/data/jcs_numbers.txt: "<IEEE 754 bits in hex> <what
// ECMAScript's Number.prototype.toString gives>" per line, the reference
// RFC 8785 §3.2.2.3 defines number serialisation by. Run with node:
//   node tests/unit/data/jcs_numbers.js 1500 > tests/unit/data/jcs_numbers.txt
const crypto = require('crypto');
const n = +process.argv[2] || 1500;
const b = Buffer.alloc(8);
const lines = [];
function emit(v) {
	if (v !== undefined)
		b.writeDoubleBE(v, 0);
	const d = b.readDoubleBE(0);
	if (Number.isFinite(d))
		lines.push(b.toString('hex') + ' ' + String(d));
}
for (let i = 0; i < n; i++) {
	crypto.randomFillSync(b);	// any bit pattern
	emit();
	const r = Math.random(), s = Math.random() < 0.5 ? -1 : 1;
	emit(s * [Math.floor(r * 1e6), r * 1000, Math.round(r * 1e8) / 100,
		  r * 1e-7, r * 1e22, 2 ** Math.floor(r * 1100 - 60),
		  Math.floor(r * 2 ** 53) + 0.5, r * 1e21][i % 8]);
}
console.log(lines.join('\n'));
